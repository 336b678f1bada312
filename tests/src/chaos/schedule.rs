//! The chaos schedule: which fault hits which server when, and for how long. It is drawn from
//! the seed alone before the run starts and printed, so a run can be replayed.

use std::fmt;
use std::time::Duration;

use super::rng::Rng;

/// How Tether reaches a fixture server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Transport {
    Stdio,
    Http,
    Sse,
}

impl Transport {
    /// Servers cycle through the three transports.
    pub fn of_server(index: usize) -> Transport {
        [Transport::Stdio, Transport::Http, Transport::Sse][index % 3]
    }

    pub fn name(self) -> &'static str {
        match self {
            Transport::Stdio => "stdio",
            Transport::Http => "http",
            Transport::Sse => "sse",
        }
    }
}

/// One kind of trouble for one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL the server's process (an HTTP fixture is restarted `restart_after` later).
    Kill,
    /// HTTP/SSE: SIGKILL it and keep the port closed for the duration.
    Down,
    /// Restarts fail (`fail_initializes`: exit 6 on stdio, HTTP 500) for the duration; the
    /// running process is killed so that a restart is needed.
    FailStarts,
    /// Calls hang (`slow_ms` huge) for the duration: Tether must time them out.
    Hang,
    /// Calls take this many ms, within the call timeout, for the duration.
    Slow(u64),
    /// Every process answers `initialize`, then exits (`flap`), for the duration; the running
    /// process is killed so that the flapping starts.
    Flap,
    /// Answers are garbage (`garbage`) for the duration.
    Garbage,
    /// Every process exits during its first call (`crash_after_calls: 1`) for the duration.
    CrashMidCall,
    /// Every process exits just after answering its first call (`crash_after_answers: 1`) for
    /// the duration: an answered call must stay answered.
    CrashAfterAnswer,
    /// stdio: processes started for the duration ignore SIGTERM and outlive their stdin
    /// (`stubborn`) for the rest of their life; the running one is killed so that one starts.
    /// Tether must SIGKILL them whenever it stops them.
    Stubborn,
    /// An operator reconnect (`tether reconnect NAME`).
    Reconnect,
}

impl Fault {
    /// A name without parameters, for counting.
    pub fn kind(self) -> &'static str {
        match self {
            Fault::Kill => "kill -9",
            Fault::Down => "down (port closed)",
            Fault::FailStarts => "restarts fail",
            Fault::Hang => "hang",
            Fault::Slow(_) => "slow",
            Fault::Flap => "flap",
            Fault::Garbage => "garbage answers",
            Fault::CrashMidCall => "crash mid-call",
            Fault::CrashAfterAnswer => "crash after answering",
            Fault::Stubborn => "stubborn (ignores SIGTERM)",
            Fault::Reconnect => "operator reconnect",
        }
    }

    /// Whether the fault is a single action rather than a state that lasts.
    pub fn instant(self) -> bool {
        matches!(self, Fault::Kill | Fault::Reconnect)
    }
}

/// A fault hitting `server` at `at` (from the start of the chaos) for `lasts`.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub at: Duration,
    pub server: usize,
    pub transport: Transport,
    pub fault: Fault,
    pub lasts: Duration,
    /// For a kill of an HTTP fixture: how long until the soak starts it again (Tether restarts
    /// stdio children itself).
    pub restart_after: Duration,
}

impl Event {
    /// One line of the printed schedule.
    pub fn line(&self, names: &[String]) -> String {
        let name = names.get(self.server).map_or("?", String::as_str);
        format!("+{:7.3}s  {name:<9} {self}", self.at.as_secs_f64())
    }
}

/// The fault and its durations (the line without time and server).
impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.fault {
            Fault::Slow(ms) => write!(f, "slow {ms} ms")?,
            other => write!(f, "{}", other.kind())?,
        }
        if !self.fault.instant() {
            write!(f, " for {:.2}s", self.lasts.as_secs_f64())?;
        }
        if self.transport != Transport::Stdio
            && matches!(self.fault, Fault::Kill | Fault::FailStarts | Fault::Flap)
        {
            write!(f, " (restart after {} ms)", self.restart_after.as_millis())?;
        }
        Ok(())
    }
}

/// The faults and their weights; `Down` only for HTTP fixtures (a stdio child that cannot
/// start is `FailStarts`), `Stubborn` only for stdio children (the soak SIGKILLs its HTTP
/// fixtures itself).
fn menu(transport: Transport) -> [(Fault, u32); 11] {
    let (down, stubborn) = if transport == Transport::Stdio {
        (0, 2)
    } else {
        (2, 0)
    };
    [
        (Fault::Kill, 4),
        (Fault::Down, down),
        (Fault::FailStarts, 2),
        (Fault::Hang, 3),
        (Fault::Slow(0), 2),
        (Fault::Flap, 2),
        (Fault::Garbage, 3),
        (Fault::CrashMidCall, 2),
        (Fault::CrashAfterAnswer, 2),
        (Fault::Stubborn, stubborn),
        (Fault::Reconnect, 1),
    ]
}

/// Draws every server's faults for `chaos` of trouble: a healthy gap, a fault, a gap, ...
/// Faults are dealt in time order, first from a shuffled deck holding each kind once (so a
/// run with enough faults has every kind, whatever the seed), then by weight.
pub fn draw(seed: u64, transports: &[Transport], chaos: Duration) -> Vec<Event> {
    let mut deal = Rng::fork(seed, u64::MAX);
    let mut deck: Vec<Fault> = menu(Transport::Stdio)
        .iter()
        .map(|(fault, _)| *fault)
        .collect();
    for i in (1..deck.len()).rev() {
        deck.swap(i, deal.below(i as u64 + 1) as usize);
    }
    let mut rngs: Vec<Rng> = (0..transports.len())
        .map(|server| Rng::fork(seed, server as u64))
        .collect();
    let mut next: Vec<Duration> = rngs.iter_mut().map(|r| r.millis(200, 1500)).collect();
    let mut events = Vec::new();
    // The server whose next fault comes first (the lowest index on a tie), until none has one.
    while let Some((server, at)) = next
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, at)| *at + Duration::from_millis(100) < chaos)
        .min_by_key(|(server, at)| (*at, *server))
    {
        let menu = menu(transports[server]);
        let applies = |fault: Fault| menu.iter().any(|(f, w)| *f == fault && *w > 0);
        let mut fault = match deck.iter().position(|f| applies(*f)) {
            Some(i) => deck.remove(i),
            None => {
                let weights: Vec<u32> = menu.iter().map(|(_, w)| *w).collect();
                menu[deal.weighted(&weights)].0
            }
        };
        let rng = &mut rngs[server];
        if fault == Fault::Slow(0) {
            fault = Fault::Slow(rng.millis(200, 900).as_millis() as u64);
        }
        let lasts = if fault.instant() {
            Duration::ZERO
        } else {
            rng.millis(500, 2500)
        };
        let restart_after = rng.millis(50, 800);
        events.push(Event {
            at,
            server,
            transport: transports[server],
            fault,
            lasts,
            restart_after,
        });
        next[server] = at + lasts + rng.millis(400, 2000);
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_draws_the_same_schedule_and_faults_never_overlap_on_a_server() {
        let transports: Vec<Transport> = (0..6).map(Transport::of_server).collect();
        let chaos = Duration::from_secs(30);
        let a = draw(3, &transports, chaos);
        assert_eq!(a, draw(3, &transports, chaos));
        assert_ne!(a, draw(4, &transports, chaos));
        for (server, transport) in transports.iter().enumerate() {
            let mine: Vec<&Event> = a.iter().filter(|e| e.server == server).collect();
            assert!(!mine.is_empty());
            for pair in mine.windows(2) {
                assert!(pair[0].at + pair[0].lasts < pair[1].at);
            }
            if *transport == Transport::Stdio {
                assert!(mine.iter().all(|e| e.fault != Fault::Down));
            } else {
                assert!(mine.iter().all(|e| e.fault != Fault::Stubborn));
            }
        }
        assert!(a.iter().all(|e| e.at < chaos));
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
        // Every kind of fault, whatever the seed, once there are enough of them.
        for seed in 0..20 {
            let kinds: std::collections::BTreeSet<&str> = draw(seed, &transports, chaos)
                .iter()
                .map(|e| e.fault.kind())
                .collect();
            assert_eq!(kinds.len(), menu(Transport::Http).len(), "seed {seed}");
        }
    }
}
