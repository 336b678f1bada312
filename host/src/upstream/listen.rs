//! A 2026-07-28 upstream sends change notifications only on `subscriptions/listen` streams.
//! Each such session keeps one stream open for what the server offers (list changes, the
//! resource URIs clients want), renews it when it ends, and reopens it when the URIs change.
//! A renewed stream may have missed changes, so every list is refreshed after it.

use std::collections::BTreeSet;
use std::time::Duration;

use rmcp::model::{ErrorCode, ServerCapabilities, ServerNotification, SubscriptionFilter};
use rmcp::service::ServiceError;
use rmcp::{Peer, RoleClient};
use tokio::sync::{broadcast, watch};

use super::{CATALOG_CHANGED, ListChanges, ServerEvent, TOOLS_CHANGED};
use crate::transport::SessionEnd;
use std::sync::Arc;

/// Longest pause between attempts to reopen a stream.
const RETRY_MAX: Duration = Duration::from_secs(5);
const RETRY_FIRST: Duration = Duration::from_millis(100);

pub(super) struct Listener {
    pub server: String,
    pub peer: Peer<RoleClient>,
    pub capabilities: ServerCapabilities,
    pub changes: Arc<ListChanges>,
    pub events: broadcast::Sender<ServerEvent>,
    pub uris: watch::Receiver<BTreeSet<String>>,
    /// Set once the session ended: the listener stops.
    pub ended: SessionEnd,
}

/// What to ask the server for: every notification it offers, and the wanted URIs if it offers
/// subscriptions. `None` when there is nothing to ask for.
pub(super) fn filter(
    capabilities: &ServerCapabilities,
    uris: &BTreeSet<String>,
) -> Option<SubscriptionFilter> {
    let on = |flag: Option<bool>| (flag == Some(true)).then_some(true);
    let mut filter = SubscriptionFilter::new();
    filter.tools_list_changed = capabilities.tools.as_ref().and_then(|t| on(t.list_changed));
    filter.prompts_list_changed = capabilities
        .prompts
        .as_ref()
        .and_then(|p| on(p.list_changed));
    filter.resources_list_changed = capabilities
        .resources
        .as_ref()
        .and_then(|r| on(r.list_changed));
    // A 2026-07-28 server takes resource subscriptions on this stream whether or not it
    // declares `resources.subscribe`; one that does not honour them never sends an update.
    if capabilities.resources.is_some() && !uris.is_empty() {
        filter.resource_subscriptions = Some(uris.iter().cloned().collect());
    }
    (filter != SubscriptionFilter::new()).then_some(filter)
}

pub(super) fn spawn(listener: Listener) {
    tokio::spawn(listener.run());
}

impl Listener {
    async fn run(mut self) {
        let mut retry = RETRY_FIRST;
        let mut renewed = false;
        loop {
            if self.ended.has_ended() {
                return;
            }
            let uris = self.uris.borrow_and_update().clone();
            let Some(filter) = filter(&self.capabilities, &uris) else {
                // Nothing to listen for until clients want a URI.
                if !self.wait_for_uris().await {
                    return;
                }
                continue;
            };
            match self.peer.listen(filter).await {
                Ok(mut stream) => {
                    retry = RETRY_FIRST;
                    if renewed {
                        // Changes may have come while no stream was open.
                        self.changes.raise(TOOLS_CHANGED | CATALOG_CHANGED);
                    }
                    renewed = true;
                    loop {
                        let next = tokio::select! {
                            next = stream.next() => next,
                            changed = self.uris.changed() => {
                                let _ = stream.cancel().await;
                                if changed.is_err() {
                                    return;
                                }
                                break;
                            }
                            _ = self.ended.ended() => return,
                        };
                        match next {
                            Ok(Some(notification)) => self.dispatch(notification),
                            Ok(None) | Err(_) => break,
                        }
                    }
                    continue;
                }
                Err(ServiceError::McpError(error)) if error.code == ErrorCode::METHOD_NOT_FOUND => {
                    tracing::info!(server = %self.server, "the server does not serve subscriptions/listen: its changes are not heard");
                    self.ended.ended().await;
                    return;
                }
                Err(error) => {
                    tracing::debug!(server = %self.server, "subscriptions/listen failed: {error}");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(retry) => {}
                _ = self.ended.ended() => return,
            }
            retry = (retry * 2).min(RETRY_MAX);
        }
    }

    /// Waits until the wanted URIs change; false if the session ended first.
    async fn wait_for_uris(&mut self) -> bool {
        tokio::select! {
            changed = self.uris.changed() => changed.is_ok(),
            _ = self.ended.ended() => false,
        }
    }

    fn dispatch(&self, notification: ServerNotification) {
        match notification {
            ServerNotification::ToolListChangedNotification(_) => self.changes.raise(TOOLS_CHANGED),
            ServerNotification::PromptListChangedNotification(_)
            | ServerNotification::ResourceListChangedNotification(_) => {
                self.changes.raise(CATALOG_CHANGED)
            }
            ServerNotification::ResourceUpdatedNotification(updated) => {
                let _ = self.events.send(ServerEvent::ResourceUpdated {
                    server: self.server.clone(),
                    uri: updated.params.uri,
                });
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_asks_for_what_the_server_offers_and_clients_want() {
        let mut capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_resources()
            .enable_resources_subscribe()
            .build();
        let none = BTreeSet::new();
        let wanted: BTreeSet<String> = ["a://1".to_string()].into();
        let tools_only = filter(&capabilities, &none).unwrap();
        assert_eq!(tools_only.tools_list_changed, Some(true));
        assert_eq!(tools_only.resources_list_changed, None);
        assert_eq!(tools_only.resource_subscriptions, None);
        let with_uri = filter(&capabilities, &wanted).unwrap();
        assert_eq!(with_uri.resource_subscriptions, Some(vec!["a://1".into()]));
        capabilities.tools = None;
        capabilities.resources = None;
        assert!(filter(&capabilities, &wanted).is_none(), "nothing offered");
    }
}
