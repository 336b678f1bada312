//! What a client's leaving releases upstream. Without Tether, a client that goes ends its
//! session with the server, and the server stops sending it updates. Through Tether the
//! server's session lives on for everyone else, so when the last downstream session or
//! `subscriptions/listen` stream that wanted a resource's updates is gone, the server is
//! unsubscribed from it, whether the client unsubscribed first or not.

use std::sync::Arc;

use crate::catalog::UriRoute;
use crate::supervisor::Supervisor;

use super::downstream::Downstream;
use super::log_levels::LogLevels;

/// A downstream listener that is released when dropped: a session, once its last handle is
/// gone (rmcp drops a session's handler when the session ends), or a listen stream.
pub(super) struct Departure {
    listener: Listener,
    supervisor: Supervisor,
    downstream: Downstream,
    /// For a session: the servers' log level may drop with it.
    log_levels: Option<Arc<LogLevels>>,
}

enum Listener {
    Session(u64),
    Stream(u64),
}

impl Departure {
    pub(super) fn session(
        session: u64,
        supervisor: Supervisor,
        downstream: Downstream,
        log_levels: Arc<LogLevels>,
    ) -> Self {
        let listener = Listener::Session(session);
        Self {
            listener,
            supervisor,
            downstream,
            log_levels: Some(log_levels),
        }
    }

    pub(super) fn stream(id: u64, supervisor: Supervisor, downstream: Downstream) -> Self {
        let listener = Listener::Stream(id);
        Self {
            listener,
            supervisor,
            downstream,
            log_levels: None,
        }
    }
}

impl Drop for Departure {
    fn drop(&mut self) {
        let (unwanted, level_dropped) = match self.listener {
            Listener::Session(session) => {
                let left = self.downstream.leave(session);
                (left.unwanted, left.level_dropped)
            }
            Listener::Stream(id) => (self.downstream.remove_stream(id), false),
        };
        let relevel = (self.log_levels.take()).filter(|levels| level_dropped && levels.in_use());
        if unwanted.is_empty() && relevel.is_none() {
            return;
        }
        // Outside a runtime (the process is ending) the servers' sessions end too.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (supervisor, downstream) = (self.supervisor.clone(), self.downstream.clone());
            runtime.spawn(async move {
                if let Some(levels) = relevel {
                    levels.tell(&supervisor, &downstream, None).await;
                }
                release(supervisor, downstream, unwanted).await;
            });
        }
    }
}

/// Unsubscribes each server from the URIs of `unwanted` it offers, unless a client wanted one
/// again meanwhile. A server that is reconnecting needs nothing: its new session knows no
/// subscriptions, and only the wanted ones are renewed on it.
#[allow(deprecated)] // resources/unsubscribe is legacy-only, and legacy servers need it
pub(super) async fn release(supervisor: Supervisor, downstream: Downstream, unwanted: Vec<String>) {
    for uri in unwanted {
        let UriRoute::Server(server) = supervisor.catalog().view().route_uri(&uri) else {
            continue;
        };
        let Some((session, spec)) = supervisor
            .shared
            .session(&server)
            .and_then(|lookup| lookup.current.map(|session| (session, lookup.spec)))
            .filter(|(session, _)| session.is_alive() && session.offers_resource_subscriptions())
        else {
            continue;
        };
        if downstream.wanted(&uri) {
            continue;
        }
        if let Err(failure) = session
            .subscribe_resource(&uri, false, &spec.timeouts)
            .await
        {
            tracing::debug!(%server, %uri, "unsubscribing upstream: {}", super::failure_words(&failure));
        }
    }
}
