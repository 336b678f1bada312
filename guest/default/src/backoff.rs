//! Backoff and self-probe delays, jittered by a seeded per-server generator so that a run can be
//! replayed exactly (and restored from a snapshot mid-sequence).

use rand_core::Rng;
use rand_pcg::Pcg32;

use crate::model::Millis;
use crate::naming::fnv64;
use crate::settings::{BackoffSettings, Jitter};

/// The jitter generator of `server`: a function of the seed and the server's name only, so
/// servers get different sequences and a replay gets the same ones.
pub fn seeded_rng(seed: u64, server: &str) -> Pcg32 {
    let state = fnv64(&[&seed.to_le_bytes(), server.as_bytes()]);
    let stream = fnv64(&[server.as_bytes()]);
    Pcg32::new(state, stream)
}

/// Uniform in `[lo, hi]` (inclusive). The modulo bias is irrelevant at these ranges.
fn uniform(rng: &mut Pcg32, lo: u64, hi: u64) -> u64 {
    if hi <= lo {
        return lo;
    }
    match (hi - lo).checked_add(1) {
        Some(span) => lo + rng.next_u64() % span,
        None => rng.next_u64(),
    }
}

/// The un-jittered delay before the `attempt`-th retry (1-based): `base * factor^(attempt-1)`,
/// capped.
pub fn exponential(b: &BackoffSettings, attempt: u32) -> Millis {
    if b.base_ms == 0 {
        return 0;
    }
    // Beyond ~1100 doublings every f64 is infinite anyway; keep `powi`'s argument in range.
    let exponent = attempt.saturating_sub(1).min(1_100) as i32;
    let delay = b.base_ms as f64 * b.factor.powi(exponent);
    if delay >= b.cap_ms as f64 {
        b.cap_ms
    } else {
        delay as Millis
    }
}

/// The jittered delay before the `attempt`-th retry. `prev` is the previous delay of this run of
/// failures (used and updated by decorrelated jitter; `None` at the start of a run).
pub fn backoff_delay(
    b: &BackoffSettings,
    attempt: u32,
    prev: &mut Option<Millis>,
    rng: &mut Pcg32,
) -> Millis {
    let delay = match b.jitter {
        Jitter::None => exponential(b, attempt),
        Jitter::Full => uniform(rng, 0, exponential(b, attempt)),
        Jitter::Decorrelated => {
            let hi = prev.unwrap_or(b.base_ms).saturating_mul(3);
            uniform(rng, b.base_ms, hi.max(b.base_ms)).min(b.cap_ms)
        }
    };
    *prev = Some(delay);
    delay
}

/// A parked server's self-probe delay: uniform in `[d/2, d]`, so parked fleets do not probe in
/// lockstep but never probe much earlier than planned.
pub fn probe_delay(d: Millis, rng: &mut Pcg32) -> Millis {
    uniform(rng, d - d / 2, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(jitter: Jitter) -> BackoffSettings {
        BackoffSettings {
            jitter,
            ..BackoffSettings::default()
        }
    }

    fn run(b: &BackoffSettings, seed: u64, server: &str, n: u32) -> Vec<Millis> {
        let mut rng = seeded_rng(seed, server);
        let mut prev = None;
        (1..=n)
            .map(|a| backoff_delay(b, a, &mut prev, &mut rng))
            .collect()
    }

    #[test]
    fn exponential_backoff_grows_by_factor_and_is_capped() {
        let b = settings(Jitter::None);
        assert_eq!(
            run(&b, 0, "s", 8),
            [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000]
        );
        assert_eq!(exponential(&b, u32::MAX), 60_000);
    }

    #[test]
    fn zero_base_means_immediate_retries_without_nan() {
        let b = BackoffSettings {
            base_ms: 0,
            cap_ms: 0,
            ..settings(Jitter::None)
        };
        assert_eq!(exponential(&b, 5_000), 0);
    }

    #[test]
    fn huge_factor_saturates_at_the_cap() {
        let b = BackoffSettings {
            factor: 1e300,
            ..settings(Jitter::None)
        };
        assert_eq!(exponential(&b, 3), 60_000);
    }

    #[test]
    fn full_jitter_stays_within_zero_and_the_exponential_delay() {
        let b = settings(Jitter::Full);
        for (i, d) in run(&b, 7, "s", 12).into_iter().enumerate() {
            assert!(d <= exponential(&b, i as u32 + 1), "attempt {}: {d}", i + 1);
        }
    }

    #[test]
    fn decorrelated_jitter_stays_between_base_and_cap_and_three_times_previous() {
        let b = settings(Jitter::Decorrelated);
        let delays = run(&b, 3, "s", 30);
        let mut prev = b.base_ms;
        for d in delays {
            assert!(d >= b.base_ms && d <= b.cap_ms, "{d}");
            assert!(d <= prev * 3, "{d} > 3 * {prev}");
            prev = d;
        }
    }

    #[test]
    fn jitter_is_replayable_for_the_same_seed_and_server() {
        let b = settings(Jitter::Full);
        assert_eq!(run(&b, 42, "files", 10), run(&b, 42, "files", 10));
    }

    #[test]
    fn different_servers_and_seeds_get_different_sequences() {
        let b = settings(Jitter::Full);
        assert_ne!(run(&b, 42, "files", 10), run(&b, 42, "github", 10));
        assert_ne!(run(&b, 42, "files", 10), run(&b, 43, "files", 10));
    }

    #[test]
    fn probe_delay_is_within_half_and_full() {
        let mut rng = seeded_rng(1, "s");
        for d in [1, 2, 3, 30_000, 1_800_000] {
            for _ in 0..50 {
                let p = probe_delay(d, &mut rng);
                assert!(p >= d - d / 2 && p <= d, "{p} for {d}");
            }
        }
    }

    #[test]
    fn uniform_handles_the_full_range() {
        let mut rng = seeded_rng(0, "s");
        let _ = uniform(&mut rng, 0, u64::MAX);
        assert_eq!(uniform(&mut rng, 5, 5), 5);
        assert_eq!(uniform(&mut rng, 9, 5), 9);
    }
}
