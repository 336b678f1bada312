//! Transports to upstream MCP servers. Each turns a server spec into an initialized rmcp client
//! session, or a classified [`Fault`] the policy can reason about.

pub mod gate;
pub mod generation;
pub mod http;
mod http_error;
pub mod limit;
pub mod lines;
pub(crate) mod oauth;
pub mod sse;
pub mod stdio;

use std::sync::Arc;

use tokio::sync::watch;

pub use crate::policy::{Fault, TransportKind};

/// A transport's name as the contract and the admin API spell it (`streamable-http`).
pub fn kind_name(kind: TransportKind) -> &'static str {
    match kind {
        TransportKind::Stdio => "stdio",
        TransportKind::StreamableHttp => "streamable-http",
        TransportKind::Sse => "sse",
    }
}

/// A transport's name in a sentence for people (`Streamable HTTP`).
pub fn kind_words(kind: TransportKind) -> &'static str {
    match kind {
        TransportKind::Stdio => "stdio",
        TransportKind::StreamableHttp => "Streamable HTTP",
        TransportKind::Sse => "SSE",
    }
}

/// Why the transport ended a session: set once, by the first fault that ends it.
///
/// When the rmcp service stops, [`SessionEnd::fault`] tells a server that forgot
/// the session (`Some(Fault::SessionExpired)`, an HTTP 404 on a session request) from a lost
/// connection or stream (`Some(Fault::TransportClosed(_))`) and revoked credentials
/// (`Some(Fault::AuthRequired(_))`). `None` means the transport recorded no fault: the service
/// was closed locally, or its worker stopped without a classified cause.
#[derive(Debug, Clone)]
pub struct SessionEnd(Arc<watch::Sender<Option<Fault>>>);

impl SessionEnd {
    pub(crate) fn new() -> Self {
        Self(Arc::new(watch::channel(None).0))
    }

    /// Records `fault` unless an earlier one already ended the session.
    pub(crate) fn set(&self, fault: Fault) {
        self.0.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            tracing::debug!(?fault, "session ends");
            *current = Some(fault);
            true
        });
    }

    pub fn fault(&self) -> Option<Fault> {
        self.0.borrow().clone()
    }

    /// Resolves once a fault has ended the session.
    pub async fn ended(&self) {
        let mut changes = self.0.subscribe();
        // The sender lives in `self`, so this only returns once a fault is set.
        let _ = changes.wait_for(Option::is_some).await;
    }
}
