//! The legacy HTTP+SSE client transport (MCP 2024-11-05), which rmcp no longer ships.
//!
//! `GET url` opens an event stream whose first `endpoint` event names the URL to POST
//! messages to; every `message` event is a JSON-RPC message from the server. The stream *is*
//! the session: when it ends, [`SseTransport::receive`] returns `None`, rmcp fails the pending
//! requests, and [`SessionEnd`] says why. Events are bounded by `max_message` before parsing.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream::BoxStream};
use http::{HeaderMap, header};
use rmcp::{
    RoleClient,
    model::ServerJsonRpcMessage,
    service::{RxJsonRpcMessage, TxJsonRpcMessage},
    transport::Transport,
};
use sse_stream::Sse;
use tokio::{sync::mpsc, task::JoinHandle};
use url::Url;

use crate::auth::Authorizer;
use crate::upstream::route;

use super::{Fault, SessionEnd, event_stream, http_error::HttpError, limit::BoundedEvents};

type Events = BoxStream<'static, Result<Sse, sse_stream::Error>>;

/// Messages buffered between the stream reader and rmcp's service loop.
const INBOX: usize = 64;

pub struct SseTransport {
    client: reqwest::Client,
    endpoint: Url,
    headers: HeaderMap,
    request_timeout: Duration,
    inbox: mpsc::Receiver<ServerJsonRpcMessage>,
    reader: JoinHandle<()>,
    end: SessionEnd,
    /// An OAuth server's authorization: a 401 ends the session as "authorization required".
    auth: Option<Arc<Authorizer>>,
}

impl SseTransport {
    /// Opens the event stream and waits for its endpoint; the caller bounds the wait.
    /// `headers` go with every request; the session's end cause is recorded in `end`.
    pub async fn connect(
        client: reqwest::Client,
        url: Url,
        headers: HeaderMap,
        request_timeout: Duration,
        max_message: usize,
        end: SessionEnd,
        auth: Option<Arc<Authorizer>>,
    ) -> Result<Self, HttpError> {
        let response = client
            .get(url.clone())
            .headers(headers.clone())
            .header(header::ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|error| HttpError::from_reqwest(&error))?;
        let status = response.status();
        if !status.is_success() {
            return Err(HttpError::Status(status.as_u16()));
        }
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default();
        if !is_event_stream(content_type) {
            return Err(HttpError::NotMcp(format!(
                "answered the SSE GET with content type {:?}, not an event stream",
                content_type.chars().take(100).collect::<String>()
            )));
        }
        // Events are bounded before they are parsed: an event without end cannot grow past
        // `max_message`, and an oversized answer fails its request (see `limit`).
        let body = BoundedEvents::new(response.bytes_stream().boxed(), max_message);
        let oversized = body.oversized();
        let mut events: Events = event_stream::events(body);
        let endpoint = loop {
            let next = tokio::select! {
                next = events.next() => next,
                // An event over the limit is dropped to its end, which may never come: the
                // endpoint cannot be read past it.
                () = oversized.seen() => return Err(HttpError::TooLarge { limit: max_message }),
            };
            match next {
                None => {
                    return Err(HttpError::Unreachable(
                        "the event stream ended before naming its endpoint".into(),
                    ));
                }
                Some(Err(error)) => {
                    if let sse_stream::Error::Body(_) = error {
                        return Err(HttpError::Unreachable(
                            "the event stream broke before naming its endpoint".into(),
                        ));
                    }
                    tracing::debug!(%error, "skipping a malformed SSE line");
                }
                Some(Ok(event)) if event.event.as_deref() == Some("endpoint") => {
                    let data = event.data.unwrap_or_default();
                    break resolve_endpoint(&url, &data).map_err(HttpError::NotMcp)?;
                }
                Some(Ok(_)) => {}
            }
        };
        let (sender, inbox) = mpsc::channel(INBOX);
        let reader = tokio::spawn(read_messages(events, sender, end.clone()));
        Ok(Self {
            client,
            endpoint,
            headers,
            request_timeout,
            inbox,
            reader,
            end,
            auth,
        })
    }
}

fn is_event_stream(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("text/event-stream"))
}

/// The POST URL an `endpoint` event names: resolved against the GET URL, and refused unless
/// it stays on the same origin (the configured headers may carry credentials).
pub fn resolve_endpoint(base: &Url, data: &str) -> Result<Url, String> {
    let endpoint = base
        .join(data.trim())
        .map_err(|error| format!("the SSE endpoint event is not a valid URL: {error}"))?;
    if endpoint.origin() != base.origin() {
        return Err("the SSE endpoint event names another origin; refusing to post there".into());
    }
    Ok(endpoint)
}

/// Forwards `message` events until the stream ends or the transport is dropped.
async fn read_messages(
    mut events: Events,
    inbox: mpsc::Sender<ServerJsonRpcMessage>,
    end: SessionEnd,
) {
    let cause = loop {
        let event = match events.next().await {
            None => break "the server closed the SSE stream",
            Some(Err(sse_stream::Error::Body(_))) => break "the SSE stream broke",
            Some(Err(error)) => {
                tracing::debug!(%error, "skipping a malformed SSE line");
                continue;
            }
            Some(Ok(event)) => event,
        };
        if !matches!(event.event.as_deref(), None | Some("") | Some("message")) {
            // Later `endpoint` events and unknown ones: the session keeps its first endpoint.
            continue;
        }
        let Some(data) = event.data else { continue };
        match serde_json::from_str::<ServerJsonRpcMessage>(&data) {
            Ok(message) => {
                if inbox.send(message).await.is_err() {
                    return;
                }
            }
            Err(error) => tracing::warn!(%error, "ignoring an SSE message that is not JSON-RPC"),
        }
    };
    // Answers arrive on this stream only: once it is gone, so is the session.
    end.finish(Fault::TransportClosed(cause.into()));
}

impl Transport<RoleClient> for SseTransport {
    type Error = HttpError;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), HttpError>> + Send + 'static {
        let request = self
            .client
            .post(self.endpoint.clone())
            .headers(self.headers.clone())
            .json(&item);
        // Written into the request: a tool call's arguments go back to the call's route.
        route::hand_back(item);
        let deadline = self.request_timeout;
        let end = self.end.clone();
        let auth = self.auth.clone();
        async move {
            // Each POST carries the token as it is now: refreshed before it expires (the
            // stream's GET carried the token of its opening, which a long session outlives).
            let request = match &auth {
                Some(authorizer) => match authorizer.access_token().await {
                    Some(mut value) => {
                        value.set_sensitive(true);
                        // In place of the one the stream opened with (`header` would add).
                        let mut now = HeaderMap::new();
                        now.insert(header::AUTHORIZATION, value);
                        request.headers(now)
                    }
                    None => request,
                },
                None => request,
            };
            let exchange = async {
                let response = request
                    .send()
                    .await
                    .map_err(|error| HttpError::from_reqwest(&error))?;
                let status = response.status();
                // Read the (short) body so the exchange is complete before we report.
                let _ = response.bytes().await;
                Ok::<_, HttpError>(status)
            };
            let status = tokio::time::timeout(deadline, exchange)
                .await
                .map_err(|_| HttpError::Timeout(deadline))??;
            if status.is_success() {
                return Ok(());
            }
            Err(match status.as_u16() {
                404 => {
                    end.set(Fault::SessionExpired);
                    HttpError::SessionExpired
                }
                code @ (401 | 403) => {
                    match auth {
                        Some(authorizer) => {
                            authorizer.on_unauthorized(None).await;
                            end.set(Fault::AuthorizationRequired(authorizer.fault_words()));
                        }
                        None => end.set(Fault::AuthRequired(code)),
                    }
                    HttpError::Status(code)
                }
                code => HttpError::Status(code),
            })
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        // The reader's end closes the inbox; a POST that ended the session ends it through
        // `SessionEnd`, which the `gate::Guarded` wrapper watches.
        self.inbox.recv().await
    }

    async fn close(&mut self) -> Result<(), HttpError> {
        self.reader.abort();
        Ok(())
    }
}

impl Drop for SseTransport {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Url {
        Url::parse("http://127.0.0.1:8080/sse?token=t").unwrap()
    }

    #[test]
    fn relative_endpoints_resolve_against_the_stream_url() {
        let endpoint = resolve_endpoint(&base(), "/messages?sessionId=abc").unwrap();
        assert_eq!(
            endpoint.as_str(),
            "http://127.0.0.1:8080/messages?sessionId=abc"
        );
        let endpoint = resolve_endpoint(&base(), " messages?sessionId=abc\n").unwrap();
        assert_eq!(
            endpoint.as_str(),
            "http://127.0.0.1:8080/messages?sessionId=abc"
        );
    }

    #[test]
    fn absolute_endpoints_on_the_same_origin_are_accepted() {
        let endpoint = resolve_endpoint(&base(), "http://127.0.0.1:8080/m?s=1").unwrap();
        assert_eq!(endpoint.as_str(), "http://127.0.0.1:8080/m?s=1");
        let default_port = Url::parse("https://example.com/sse").unwrap();
        assert!(resolve_endpoint(&default_port, "https://example.com:443/m").is_ok());
    }

    #[test]
    fn other_origins_are_refused() {
        for data in [
            "http://evil.example/messages",
            "//evil.example/messages",
            "http://127.0.0.1:8081/messages",
            "https://127.0.0.1:8080/messages",
        ] {
            assert!(resolve_endpoint(&base(), data).is_err(), "{data}");
        }
    }

    /// A call's route gets its arguments back once the POST's body is written, even when the
    /// POST cannot reach the server: the call path keeps no copy of its own.
    #[tokio::test]
    async fn a_posted_call_hands_its_arguments_back() {
        use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest, RequestId};
        let down = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let (_sender, inbox) = mpsc::channel(1);
        let mut transport = SseTransport {
            client: reqwest::Client::new(),
            endpoint: Url::parse(&format!("http://{down}/messages")).unwrap(),
            headers: HeaderMap::new(),
            request_timeout: Duration::from_secs(10),
            inbox,
            reader: tokio::spawn(async {}),
            end: SessionEnd::new(),
            auth: None,
        };
        let arguments = serde_json::json!({"n": 1}).as_object().unwrap().clone();
        let route = Arc::new(route::CallRoute::default());
        let mut call =
            CallToolRequest::new(CallToolRequestParams::new("t").with_arguments(arguments.clone()));
        call.extensions.insert(route::RouteTag(route.clone()));
        let message = rmcp::model::ClientJsonRpcMessage::request(
            ClientRequest::CallToolRequest(call),
            RequestId::Number(1),
        );
        assert!(transport.send(message).await.is_err());
        assert_eq!(route.take_back(), Some(Some(arguments)));
    }

    #[test]
    fn content_types() {
        assert!(is_event_stream("text/event-stream"));
        assert!(is_event_stream("Text/Event-Stream; charset=utf-8"));
        assert!(!is_event_stream("text/html"));
        assert!(!is_event_stream(""));
    }
}
