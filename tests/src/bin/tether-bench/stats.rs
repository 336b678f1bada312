//! Percentiles over collected samples.

use std::time::Duration;

/// Sorted samples in nanoseconds.
pub struct Samples(Vec<u64>);

impl Samples {
    pub fn new(mut nanos: Vec<u64>) -> Self {
        nanos.sort_unstable();
        Self(nanos)
    }

    pub fn from_durations(durations: &[Duration]) -> Self {
        Self::new(durations.iter().map(|d| d.as_nanos() as u64).collect())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The `q` quantile (0..=1), nearest rank.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.0.is_empty() {
            return 0;
        }
        let rank = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len());
        self.0[rank - 1]
    }

    pub fn median(&self) -> u64 {
        self.quantile(0.5)
    }

    pub fn max(&self) -> u64 {
        self.0.last().copied().unwrap_or(0)
    }
}

/// What one path measured over all rounds: every call's latency, and the wall time they took.
#[derive(Default)]
pub struct Measured {
    pub latencies: Vec<Duration>,
    pub wall: Duration,
}

impl Measured {
    /// Calls per second.
    pub fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.wall.as_secs_f64()
    }
}

pub fn us(nanos: u64) -> String {
    format!("{:.1} µs", nanos as f64 / 1e3)
}

/// The signed difference `a - b` of two durations in nanoseconds, in µs with its sign.
pub fn us_delta(a: u64, b: u64) -> String {
    format!("{:+.1} µs", (a as f64 - b as f64) / 1e3)
}

pub fn ms(nanos: u64) -> String {
    format!("{:.2} ms", nanos as f64 / 1e6)
}
