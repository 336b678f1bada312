//! What operators and embedders hear as it happens: lifecycle changes, tool list changes and the
//! policy's notices, merged into one stream of [`Event`]s (the admin API's `GET /events`, the
//! embedder's observer). Each kind comes in the order it happened; between kinds, an event may
//! overtake one that happened just before it (a tool withdrawal, the state change that caused
//! it).

use tokio::sync::broadcast::{self, error::RecvError};

pub use crate::policy::PolicyNotice;
pub use crate::registry::RegistryChange;
pub use crate::supervisor::LifecycleEvent;
use crate::supervisor::Supervisor;

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Event {
    /// A server changed state.
    Lifecycle(LifecycleEvent),
    /// The tools published for a server changed.
    Tools(RegistryChange),
    /// The policy runtime has news: a fault, a recovery, a fallback, a swap, a shadow.
    Policy {
        /// What happened.
        notice: PolicyNotice,
    },
    /// The listener fell behind and `missed` events were dropped.
    Lagged {
        /// How many.
        missed: u64,
    },
}

/// The merged feeds of one supervisor, subscribed when made: nothing after that is missed
/// (short of lagging).
pub struct Feed {
    lifecycle: broadcast::Receiver<LifecycleEvent>,
    tools: broadcast::Receiver<RegistryChange>,
    notices: broadcast::Receiver<PolicyNotice>,
}

impl Feed {
    /// Subscribes to `supervisor`'s feeds.
    pub(crate) fn new(supervisor: &Supervisor) -> Self {
        Self {
            lifecycle: supervisor.lifecycle(),
            tools: supervisor.registry().subscribe(),
            notices: supervisor.policy().notices(),
        }
    }

    /// An event already waiting, if any (for draining at the end).
    pub fn try_next(&mut self) -> Option<Event> {
        use broadcast::error::TryRecvError;
        fn event<T>(
            received: Result<T, TryRecvError>,
            wrap: impl FnOnce(T) -> Event,
        ) -> Option<Event> {
            match received {
                Ok(value) => Some(wrap(value)),
                Err(TryRecvError::Lagged(missed)) => Some(Event::Lagged { missed }),
                Err(TryRecvError::Empty | TryRecvError::Closed) => None,
            }
        }
        event(self.lifecycle.try_recv(), Event::Lifecycle)
            .or_else(|| event(self.tools.try_recv(), Event::Tools))
            .or_else(|| event(self.notices.try_recv(), |notice| Event::Policy { notice }))
    }

    /// The next event; `None` once the supervisor is gone.
    pub async fn next(&mut self) -> Option<Event> {
        fn event<T>(
            received: Result<T, RecvError>,
            wrap: impl FnOnce(T) -> Event,
        ) -> Option<Event> {
            match received {
                Ok(value) => Some(wrap(value)),
                Err(RecvError::Lagged(missed)) => Some(Event::Lagged { missed }),
                Err(RecvError::Closed) => None,
            }
        }
        tokio::select! {
            received = self.lifecycle.recv() => event(received, Event::Lifecycle),
            received = self.tools.recv() => event(received, Event::Tools),
            received = self.notices.recv() => event(received, |notice| Event::Policy { notice }),
        }
    }
}
