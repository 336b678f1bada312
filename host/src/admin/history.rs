//! The last hour of events, kept for `GET /history` (the dashboard draws its timelines from it):
//! a page opened now sees what happened before it was opened.
//!
//! Bounded twice, by age and by count, so a flapping server cannot grow it without end.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::task::JoinHandle;

use super::api::TimedEvent;
use crate::events::{Event, Feed};
use crate::supervisor::Supervisor;

/// How far back the history reaches.
pub const KEPT_FOR: Duration = Duration::from_secs(3600);
/// The most events kept, whatever their age (~200 bytes each).
pub const MAX_EVENTS: usize = 20_000;

/// The recorded events of one supervisor. Clones share them; the recording stops when the last
/// clone is dropped or the supervisor is gone.
#[derive(Clone)]
pub struct History {
    events: Arc<Mutex<Recorded>>,
    _recorder: Arc<AbortOnDrop>,
}

/// The recording task, stopped with the last [`History`].
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl History {
    /// Starts recording `supervisor`'s events (subscribed before this returns: nothing after
    /// it is missed, short of lagging). Needs a tokio runtime.
    pub fn record(supervisor: &Supervisor) -> History {
        let mut feed = Feed::new(supervisor);
        let events = Arc::new(Mutex::new(Recorded::default()));
        let recorded = events.clone();
        let task = tokio::spawn(async move {
            while let Some(event) = feed.next().await {
                let mut events = recorded.lock().unwrap_or_else(|e| e.into_inner());
                events.push(SystemTime::now(), event);
            }
        });
        History {
            events,
            _recorder: Arc::new(AbortOnDrop(task)),
        }
    }

    /// The events of the last hour, oldest first.
    pub fn events(&self) -> Vec<TimedEvent> {
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        events.forget_before(SystemTime::now());
        events.list.iter().map(|(_, event)| event.clone()).collect()
    }
}

/// The events with the times they were recorded at, oldest first.
#[derive(Default)]
struct Recorded {
    list: VecDeque<(SystemTime, TimedEvent)>,
}

impl Recorded {
    fn push(&mut self, at: SystemTime, event: Event) {
        self.list.push_back((
            at,
            TimedEvent {
                time: crate::status::rfc3339(at),
                event,
            },
        ));
        while self.list.len() > MAX_EVENTS {
            self.list.pop_front();
        }
        self.forget_before(at);
    }

    /// Drops what is older than [`KEPT_FOR`] at `now`.
    fn forget_before(&mut self, now: SystemTime) {
        let Some(horizon) = now.checked_sub(KEPT_FOR) else {
            return;
        };
        while self.list.front().is_some_and(|(at, _)| *at < horizon) {
            self.list.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::LifecycleEvent;
    use crate::policy::ServerState;

    fn change(server: &str) -> Event {
        Event::Lifecycle(LifecycleEvent {
            server: server.into(),
            state: ServerState::Healthy,
            detail: String::new(),
        })
    }

    #[test]
    fn events_older_than_an_hour_are_forgotten() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut recorded = Recorded::default();
        recorded.push(start, change("old"));
        recorded.push(start + Duration::from_secs(60), change("kept"));
        recorded.push(start + KEPT_FOR + Duration::from_secs(30), change("new"));
        let servers: Vec<_> = recorded
            .list
            .iter()
            .map(|(_, e)| match &e.event {
                Event::Lifecycle(l) => l.server.clone(),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(servers, ["kept", "new"]);
    }

    #[test]
    fn at_most_max_events_are_kept() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut recorded = Recorded::default();
        for i in 0..MAX_EVENTS + 10 {
            recorded.push(start + Duration::from_millis(i as u64), change("s"));
        }
        assert_eq!(recorded.list.len(), MAX_EVENTS);
    }
}
