//! The first answer agents get. A client that lists once when it starts (an inspector, a
//! script, an agent that ignores `list_changed`) must not get an empty list because Tether
//! answered before its servers connected. Until every server configured at start has connected
//! (and the policy decided what to publish), failed its first attempt, or been parked or
//! stopped by the policy, within a startup wait, lists and calls that name no known tool wait;
//! later ones never do.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// Servers whose first attempt has not settled, and until when anyone waits for them.
pub(crate) struct Startup {
    unsettled: watch::Sender<BTreeSet<String>>,
    until: Mutex<Option<Instant>>,
}

impl Default for Startup {
    fn default() -> Self {
        Self {
            unsettled: watch::channel(BTreeSet::new()).0,
            until: Mutex::new(None),
        }
    }
}

impl Startup {
    /// Starts the startup wait: servers added from now until `wait` has passed are waited for.
    pub(crate) fn begin(&self, wait: Duration) {
        *self.until.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + wait);
    }

    fn until(&self) -> Option<Instant> {
        let until = *self.until.lock().unwrap_or_else(|e| e.into_inner());
        until.filter(|until| *until > Instant::now())
    }

    /// A server was added: while the wait runs, its first attempt is waited for.
    pub(crate) fn track(&self, server: &str) {
        if self.until().is_some() {
            self.unsettled.send_modify(|pending| {
                pending.insert(server.to_string());
            });
        }
    }

    /// `server`'s first attempt settled (or the server went away); later calls do nothing.
    pub(crate) fn settle(&self, server: &str) {
        self.unsettled
            .send_if_modified(|pending| pending.remove(server));
    }

    /// Waits until every tracked server settled, or the startup wait ended. Returns at once
    /// after startup.
    pub(crate) async fn settled(&self) {
        let Some(until) = self.until() else {
            return;
        };
        let mut unsettled = self.unsettled.subscribe();
        let _ = tokio::time::timeout_at(until, unsettled.wait_for(BTreeSet::is_empty)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn waits_for_tracked_servers_within_the_startup_wait_only() {
        let startup = Arc::new(Startup::default());
        // Before the wait begins, nothing is tracked.
        startup.track("early");
        startup.settled().await;
        startup.begin(Duration::from_secs(5));
        startup.track("a");
        startup.track("b");
        let waiting = {
            let startup = startup.clone();
            tokio::spawn(async move { startup.settled().await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "two servers are unsettled");
        startup.settle("a");
        startup.settle("a");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "b is unsettled");
        startup.settle("b");
        tokio::time::timeout(Duration::from_millis(10), waiting)
            .await
            .expect("settled")
            .unwrap();
        // An unsettled server is waited for only until the wait ends.
        startup.track("late");
        let started = Instant::now();
        startup.settled().await;
        assert!(started.elapsed() <= Duration::from_secs(5));
        assert!(startup.until().is_none());
        // After the wait, nobody waits.
        startup.track("after");
        startup.settled().await;
    }
}
