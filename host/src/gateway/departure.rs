//! What a client's leaving releases upstream. Without Tether, a client that goes ends its
//! session with the server, and the server stops sending it updates. Through Tether the
//! server's session lives on for everyone else, so when the last downstream session or
//! `subscriptions/listen` stream that wanted a resource's updates is gone, the server is
//! unsubscribed from it, whether the client unsubscribed first or not.

use super::Gateway;

/// A downstream listener that is released when dropped: a session, once its last handle is
/// gone (rmcp drops a session's handler when the session ends), or a listen stream.
pub(super) struct Departure {
    listener: Listener,
    /// A handle on the listener's session that carries no departure of its own (boxed: a
    /// gateway holds its departure).
    gateway: Box<Gateway>,
}

enum Listener {
    Session(u64),
    Stream(u64),
}

impl Departure {
    pub(super) fn session(gateway: &Gateway) -> Self {
        Self {
            listener: Listener::Session(gateway.session),
            gateway: Box::new(gateway.same_session()),
        }
    }

    pub(super) fn stream(id: u64, gateway: &Gateway) -> Self {
        Self {
            listener: Listener::Stream(id),
            gateway: Box::new(gateway.same_session()),
        }
    }
}

impl Drop for Departure {
    fn drop(&mut self) {
        let downstream = &self.gateway.downstream;
        let (unwanted, level_dropped) = match self.listener {
            Listener::Session(session) => {
                let left = downstream.leave(session);
                (left.unwanted, left.level_dropped)
            }
            Listener::Stream(id) => (downstream.remove_stream(id), false),
        };
        // The servers' level may drop with a session that had set one.
        let relevel = level_dropped && self.gateway.log_levels.in_use();
        if unwanted.is_empty() && !relevel {
            return;
        }
        // Outside a runtime (the process is ending) the servers' sessions end too.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let gateway = self.gateway.same_session();
            runtime.spawn(async move {
                if relevel {
                    gateway.tell_log_levels(None).await;
                }
                gateway.release(unwanted).await;
            });
        }
    }
}

impl Gateway {
    /// Unsubscribes each server from the URIs of `unwanted` it offers, unless a client wanted
    /// one again meanwhile. A server that is reconnecting needs nothing: its new session knows
    /// no subscriptions, and only the wanted ones are renewed on it.
    pub(super) async fn release(&self, unwanted: Vec<String>) {
        for uri in unwanted {
            let Ok(server) = self.route_uri(&uri, false) else {
                continue;
            };
            let Some((session, spec)) = self.live(&server) else {
                continue;
            };
            if !session.offers_resource_subscriptions() || self.downstream.wanted(&uri) {
                continue;
            }
            if let Err(failure) = session
                .subscribe_resource(&uri, false, &spec.timeouts)
                .await
            {
                let why = super::failure_words(&failure);
                tracing::debug!(%server, %uri, "unsubscribing upstream: {why}");
            }
        }
    }
}
