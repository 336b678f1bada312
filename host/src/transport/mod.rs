//! Transports to upstream MCP servers. Each turns a server spec into an initialized rmcp client
//! session, or a classified [`Fault`] the policy can reason about.

/// The two methods of rmcp's `StreamableHttpClient` that each of Tether's HTTP clients (the
/// session's guard, the OAuth signer, the poster under them) writes the same way: the forms
/// without limits send through the forms with them, at rmcp's default limits. The trait's own
/// defaults go the other way, and would drop the limits a layer above passes down. `$failed`:
/// the client's error.
macro_rules! forms_without_limits {
    ($failed:ty) => {
        async fn post_message(
            &self,
            uri: ::std::sync::Arc<str>,
            message: ::rmcp::model::ClientJsonRpcMessage,
            session_id: Option<::std::sync::Arc<str>>,
            auth_header: Option<String>,
            custom_headers: ::std::collections::HashMap<::http::HeaderName, ::http::HeaderValue>,
        ) -> Result<::rmcp::transport::streamable_http_client::StreamableHttpPostResponse, $failed>
        {
            self.post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                ::rmcp::transport::streamable_http_client::StreamableHttpResponseLimits::default(),
            )
            .await
        }

        async fn get_stream(
            &self,
            uri: ::std::sync::Arc<str>,
            session_id: Option<::std::sync::Arc<str>>,
            last_event_id: Option<String>,
            auth_header: Option<String>,
            custom_headers: ::std::collections::HashMap<::http::HeaderName, ::http::HeaderValue>,
        ) -> Result<
            ::futures::stream::BoxStream<'static, Result<::sse_stream::Sse, ::sse_stream::Error>>,
            $failed,
        > {
            self.get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                ::rmcp::transport::streamable_http_client::StreamableHttpResponseLimits::default()
                    .max_sse_event_size,
            )
            .await
        }
    };
}

pub(crate) mod event_stream;
pub mod gate;
pub mod generation;
pub mod http;
mod http_error;
pub(crate) mod kept;
pub mod limit;
pub mod lines;
pub(crate) mod oauth;
pub(crate) mod own_stdio;
pub(crate) mod pipe_size;
pub(crate) mod post;
mod redirect;
pub(crate) mod server_log;
pub mod sse;
pub mod stdio;
pub(crate) mod tls;
pub(crate) mod wire;

use std::sync::Arc;
use std::time::Duration;

use rmcp::service::RunningService;
use rmcp::{ClientHandler, RoleClient};
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

/// A session's end and its cause, the one place the rest of the host hears of both.
///
/// The cause is recorded once, by whoever learns it first: an HTTP 404 on a session request
/// (`Fault::SessionExpired`: the server forgot the session), a stream lost for good
/// (`Fault::TransportClosed(_)`), revoked credentials (`Fault::AuthRequired(_)`), the stdio
/// reaper with the child's exit status. A recorded cause does not end the session by itself:
/// requests in flight still get their own answers for a moment (a 404 to a request proves it
/// did not run), until the service stops ([`watch_service`]). A child's exit ends it at once
/// ([`SessionEnd::finish`]).
#[derive(Debug, Clone)]
pub struct SessionEnd(Arc<watch::Sender<EndState>>);

#[derive(Debug, Default)]
struct EndState {
    cause: Option<Fault>,
    over: bool,
}

impl Default for SessionEnd {
    fn default() -> Self {
        Self::new()
    }
}

impl SessionEnd {
    pub fn new() -> Self {
        Self(Arc::new(watch::channel(EndState::default()).0))
    }

    /// Records why the session ends, unless a cause is known already.
    pub(crate) fn set(&self, fault: Fault) {
        self.update(fault, false);
    }

    /// Ends the session, with `fault` as its cause unless one is known already.
    pub(crate) fn finish(&self, fault: Fault) {
        self.update(fault, true);
    }

    fn update(&self, fault: Fault, over: bool) {
        self.0.send_if_modified(|state| {
            let mut changed = false;
            if state.cause.is_none() {
                tracing::debug!(?fault, "session ends");
                state.cause = Some(fault);
                changed = true;
            }
            if over && !state.over {
                state.over = true;
                changed = true;
            }
            changed
        });
    }

    /// Why the session ends, once that is known (it may not have ended yet).
    pub fn fault(&self) -> Option<Fault> {
        self.0.borrow().cause.clone()
    }

    /// Whether the session has ended.
    pub fn has_ended(&self) -> bool {
        self.0.borrow().over
    }

    /// Resolves once a cause is recorded.
    pub async fn recorded(&self) {
        let mut changes = self.0.subscribe();
        // The sender lives in `self`, so this only returns once a cause is set.
        let _ = changes.wait_for(|state| state.cause.is_some()).await;
    }

    /// Resolves once the session has ended (then [`Self::fault`] says why).
    pub async fn ended(&self) {
        let mut changes = self.0.subscribe();
        let _ = changes.wait_for(|state| state.over).await;
    }
}

/// Ends the session when its service stops: a stdio child whose stdout closed gets
/// `STDOUT_GRACE` to exit (the reaper then ends it with its status); a process that closes
/// stdout and lives on is ended as such. The task owns the service until it stops.
pub(crate) fn watch_service<H: ClientHandler>(
    service: RunningService<RoleClient, H>,
    exit: Option<stdio::ExitWatch>,
    kind: TransportKind,
    end: SessionEnd,
) {
    tokio::spawn(async move {
        let _ = service.waiting().await;
        if let Some(exit) = exit
            && !end.has_ended()
            && exit.within(STDOUT_GRACE).await.is_none()
        {
            end.finish(Fault::TransportClosed(
                "the server closed its stdout but did not exit".into(),
            ));
        }
        end.finish(session_closed(kind));
    });
}

/// How long a child whose stdout closed has to exit before that is its session's end.
const STDOUT_GRACE: Duration = Duration::from_secs(2);

/// The end of a session that stopped with no cause recorded (closed by Tether, say).
pub(crate) fn session_closed(kind: TransportKind) -> Fault {
    Fault::TransportClosed(format!("the {} session ended", kind_words(kind)))
}
