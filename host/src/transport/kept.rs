//! Kept connections for the POSTs of tool calls to a plain-HTTP server.
//!
//! reqwest's pool stays off (`http.rs`): on a connection a client reuses, Linux delays the
//! client's ACK by up to 40 ms, and a server that leaves Nagle's algorithm on (rmcp's and axum's
//! default) holds the second small write of its answer until that ACK comes: 40 ms a call. Here
//! every read that brings bytes re-arms `TCP_QUICKACK`, which sends the pending ACK at once, so
//! the connection can be kept: no TCP connect a call (measured: 11 % of the gateway's CPU a call,
//! and the server's accept). reqwest gives no access to its sockets, hence this client.
//!
//! Only `http://` endpoints that no proxy setting intercepts: TLS and proxies stay with reqwest.
//! Redirects are followed as reqwest's client follows them ([`follows_redirect`]).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How long an idle connection is kept. Below the 5 s after which Node's and uvicorn's servers
/// close an idle connection, so a call is not written into a connection the server is closing.
const IDLE: Duration = Duration::from_secs(2);

/// Idle connections kept to one server, at most.
const MAX_IDLE: usize = 32;

/// A pool of plain-HTTP connections whose reads acknowledge at once.
#[derive(Clone)]
pub(crate) struct KeptConnections {
    client: Client<QuickAckConnector, Full<Bytes>>,
    proxies: std::sync::Arc<Matcher>,
}

impl std::fmt::Debug for KeptConnections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeptConnections")
    }
}

/// Redirects a POST follows at most.
pub(crate) const MAX_REDIRECTS: usize = 10;

/// Whether a POST to `first` that was redirected with `status` to `next` is sent there: only
/// same-origin 307/308, since others would drop the body or hand the session id and the
/// configured headers to another host.
pub(crate) fn follows_redirect(status: http::StatusCode, first: &url::Url, next: &url::Url) -> bool {
    matches!(status.as_u16(), 307 | 308) && first.origin() == next.origin()
}

/// The same rule for reqwest's client.
pub(crate) fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let follows = attempt
            .previous()
            .first()
            .is_some_and(|first| follows_redirect(attempt.status(), first, attempt.url()));
        if !follows {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    })
}

/// Where the kept connections send a POST that `response` redirects, if they do.
pub(crate) fn redirect(
    first: &url::Url,
    current: &url::Url,
    response: &reqwest::Response,
) -> Option<(url::Url, http::Uri)> {
    let location = response.headers().get(http::header::LOCATION)?.to_str().ok()?;
    let next = current.join(location).ok()?;
    if !follows_redirect(response.status(), first, &next) {
        return None;
    }
    let uri = http::Uri::try_from(next.as_str()).ok()?;
    Some((next, uri))
}

/// The `Referer` reqwest's client sends with a redirected request: the URL redirected from,
/// without credentials or fragment.
pub(crate) fn referer(from: &url::Url) -> Option<http::HeaderValue> {
    let mut referer = from.clone();
    referer.set_username("").ok()?;
    referer.set_password(None).ok()?;
    referer.set_fragment(None);
    http::HeaderValue::from_str(referer.as_str()).ok()
}

/// Why a POST over the kept connections failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeptFailed {
    #[error(transparent)]
    Send(#[from] hyper_util::client::legacy::Error),
    #[error("more than {MAX_REDIRECTS} redirects")]
    TooManyRedirects,
}

impl KeptFailed {
    /// Whether nothing was sent: no connection could be made.
    pub(crate) fn sent_nothing(&self) -> bool {
        matches!(self, Self::Send(error) if error.is_connect())
    }
}

impl KeptConnections {
    pub(crate) fn new(connect_timeout: Duration) -> Self {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(IDLE)
            .pool_max_idle_per_host(MAX_IDLE)
            .pool_timer(TokioTimer::new())
            .build(QuickAckConnector { http });
        Self {
            client,
            // What reqwest's client reads too (its default: the system's proxy settings).
            proxies: std::sync::Arc::new(Matcher::from_system()),
        }
    }

    /// Whether a POST to `uri` goes through these connections: plain HTTP, no proxy.
    pub(crate) fn serves(&self, uri: &http::Uri) -> bool {
        uri.scheme() == Some(&http::uri::Scheme::HTTP) && self.proxies.intercept(uri).is_none()
    }

    /// POSTs `body` with `headers` to `uri`; the answer reads as reqwest's would, so it is
    /// taken apart by the same code.
    pub(crate) async fn post(
        &self,
        uri: http::Uri,
        headers: http::HeaderMap,
        body: Bytes,
    ) -> Result<reqwest::Response, KeptFailed> {
        let mut request = http::Request::new(Full::new(body));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        let response = self.client.request(request).await?;
        Ok(reqwest::Response::from(response.map(reqwest::Body::wrap)))
    }
}

/// Opens plain TCP connections as hyper's own connector does, and wraps them.
#[derive(Clone)]
struct QuickAckConnector {
    http: HttpConnector,
}

impl tower_service::Service<http::Uri> for QuickAckConnector {
    type Response = TokioIo<QuickAck>;
    type Error = <HttpConnector as tower_service::Service<http::Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connecting = self.http.call(uri);
        Box::pin(async move {
            let stream = connecting.await?.into_inner();
            Ok(TokioIo::new(QuickAck(stream)))
        })
    }
}

/// A TCP stream that acknowledges what it read at once.
pub(crate) struct QuickAck(TcpStream);

impl AsyncRead for QuickAck {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.0).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            // Linux clears the option on its own; a failure only costs the 40 ms it would.
            let _ = socket2::SockRef::from(&self.0).set_tcp_quickack(true);
        }
        read
    }
}

impl AsyncWrite for QuickAck {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl Connection for QuickAck {
    fn connected(&self) -> Connected {
        self.0.connected()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A server that leaves Nagle on and writes each answer in two small writes, as rmcp's does
    /// (an event stream's priming event, then the answer). Returns its address and the number
    /// of connections it accepted.
    async fn nagle_server() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buffer = [0u8; 4096];
                    loop {
                        let Ok(read @ 1..) = stream.read(&mut buffer).await else {
                            return;
                        };
                        request.extend_from_slice(&buffer[..read]);
                        // The test's requests carry a body of two bytes.
                        let Some(head) = request.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        if request.len() < head + 4 + 2 {
                            continue;
                        }
                        request.clear();
                        let first = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                                     transfer-encoding: chunked\r\n\r\n3\r\n:\n\n\r\n";
                        let second = "a\r\ndata: {}\n\n\r\n0\r\n\r\n";
                        for part in [first, second] {
                            if stream.write_all(part.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (address, accepted)
    }

    /// Without the quick ACK every call after the first waits ~40 ms for the server's second
    /// write (measured: 20 calls in ~800 ms); with it the calls take microseconds each.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kept_connection_answers_without_the_delayed_ack() {
        let (address, accepted) = nagle_server().await;
        let kept = KeptConnections::new(Duration::from_secs(5));
        let uri: http::Uri = format!("http://{address}/mcp").parse().unwrap();
        assert!(kept.serves(&uri));
        let started = Instant::now();
        for _ in 0..20 {
            let body = Bytes::from_static(b"{}");
            let response = kept.post(uri.clone(), http::HeaderMap::new(), body).await.unwrap();
            assert_eq!(response.bytes().await.unwrap(), ":\n\ndata: {}\n\n");
        }
        let took = started.elapsed();
        // A connection a call is what reqwest's client (pool off) does. hyper may open a second
        // one when a call starts before the last has gone back to the pool.
        let accepted = accepted.load(Ordering::SeqCst);
        assert!(accepted < 10, "{accepted} connections for 20 calls");
        assert!(took < Duration::from_millis(400), "20 calls took {took:?}");
    }

    #[test]
    fn only_same_origin_307_and_308_are_followed() {
        let first = url::Url::parse("http://a.example/mcp").unwrap();
        let same = url::Url::parse("http://a.example/mcp/").unwrap();
        let other = url::Url::parse("http://b.example/mcp").unwrap();
        let followed = |status: u16, next: &url::Url| {
            follows_redirect(http::StatusCode::from_u16(status).unwrap(), &first, next)
        };
        assert!(followed(307, &same) && followed(308, &same));
        assert!(!followed(307, &other) && !followed(308, &other));
        assert!(!followed(301, &same) && !followed(302, &same) && !followed(303, &same));
    }

    #[test]
    fn only_plain_http_without_a_proxy_is_served() {
        let kept = KeptConnections::new(Duration::from_secs(1));
        assert!(!kept.serves(&"https://example.com/mcp".parse().unwrap()));
        let proxied = KeptConnections {
            proxies: Arc::new(
                Matcher::builder()
                    .http("http://proxy.example:3128")
                    .no("localhost")
                    .build(),
            ),
            ..kept
        };
        assert!(!proxied.serves(&"http://example.com/mcp".parse().unwrap()));
        assert!(proxied.serves(&"http://localhost:8080/mcp".parse().unwrap()));
    }
}
