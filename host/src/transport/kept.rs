//! Kept connections for the POSTs of tool calls to an HTTP server.
//!
//! reqwest's pool stays off (`http.rs`): on a connection a client reuses, Linux delays the
//! client's ACK by up to 40 ms, and a server that leaves Nagle's algorithm on (rmcp's and axum's
//! default) holds the second small write of its answer until that ACK comes: 40 ms a call. Here
//! every read that brings bytes re-arms `TCP_QUICKACK`, which sends the pending ACK at once, so
//! the connection can be kept: no TCP connect a call (measured: 11 % of the gateway's CPU a call,
//! and the server's accept), nor a TLS handshake. reqwest gives no access to its sockets, hence
//! this client.
//!
//! Only for servers configured with `keep_connections`: a TCP relay in front of a Nagle server
//! (docker-proxy, `kubectl port-forward`) keeps its own connection to the server as long as this
//! one is kept, and its delayed ACK then holds every answer ~40 ms. Tether cannot see a relay.
//!
//! TLS is reqwest's, set up once for every client (`tls.rs`), speaking HTTP/1.1. Only for URLs
//! without credentials that no proxy setting intercepts, and only where Tether can set
//! `TCP_QUICKACK` (Linux): the rest stays with reqwest.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::{redirect, tls};

/// How long an idle connection is kept: below the 2 s after which gunicorn closes an idle
/// connection (Node's and uvicorn's servers: 5 s), so that a call is not written into a
/// connection the server is closing (such a call fails, and is not sent again).
const IDLE: Duration = Duration::from_secs(1);

/// Idle connections kept to one server, at most.
const MAX_IDLE: usize = 32;

/// A pool of HTTP connections whose reads acknowledge at once.
#[derive(Clone, Debug)]
pub(crate) struct KeptConnections {
    client: Client<Timed, Full<Bytes>>,
    proxies: Arc<Matcher>,
}

/// Why a POST over the kept connections failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeptFailed {
    #[error(transparent)]
    Send(#[from] hyper_util::client::legacy::Error),
    #[error("more than {} redirects", redirect::MAX_REDIRECTS)]
    TooManyRedirects,
}

impl KeptFailed {
    /// Whether nothing was sent: no connection could be made.
    pub(crate) fn sent_nothing(&self) -> bool {
        matches!(self, Self::Send(error) if error.is_connect())
    }
}

impl KeptConnections {
    /// `None` where reads cannot acknowledge at once (kept connections would wait 40 ms
    /// there), or where the platform's certificate verifier cannot be set up: said once.
    pub(crate) fn new(connect_timeout: Duration) -> Option<Self> {
        // What reqwest's client reads too (its default: the system's proxy settings).
        let kept = if QUICK_ACK {
            Self::with(connect_timeout, Matcher::from_system())
        } else {
            None
        };
        if kept.is_none() {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    "keep_connections is ignored: {}",
                    if QUICK_ACK {
                        "the platform's certificate verifier cannot be set up"
                    } else {
                        "only Linux can acknowledge reads at once"
                    }
                );
            });
        }
        kept
    }

    fn with(connect_timeout: Duration, proxies: Matcher) -> Option<Self> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        // reqwest's defaults: a silent peer is found in about a minute.
        http.set_keepalive(Some(Duration::from_secs(15)));
        http.set_keepalive_interval(Some(Duration::from_secs(15)));
        http.set_keepalive_retries(Some(3));
        let connector = Timed {
            connector: HttpsConnector::from((QuickAckConnector { http }, tls::http1()?)),
            limit: connect_timeout,
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(IDLE)
            .pool_max_idle_per_host(MAX_IDLE)
            .pool_timer(TokioTimer::new())
            .build(connector);
        Some(Self {
            client,
            proxies: Arc::new(proxies),
        })
    }

    /// Kept connections that ignore the environment's proxies, for tests.
    #[cfg(test)]
    pub(crate) fn without_proxies(connect_timeout: Duration) -> Self {
        Self::with(connect_timeout, Matcher::builder().build()).expect("the platform's verifier")
    }

    /// `url` as these connections send to it, if they do: no credentials in it (reqwest turns
    /// them into a header), no proxy.
    pub(crate) fn serves(&self, url: &url::Url) -> Option<http::Uri> {
        let web = matches!(url.scheme(), "http" | "https");
        if !web || !url.username().is_empty() || url.password().is_some() {
            return None;
        }
        let uri = http::Uri::try_from(url.as_str()).ok()?;
        self.proxies.intercept(&uri).is_none().then_some(uri)
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

/// Bounds a whole connect, TLS handshake included, as reqwest's `connect_timeout` does (hyper's
/// connector bounds only the TCP connect). Running out is a connect error: nothing was sent.
#[derive(Clone)]
struct Timed {
    connector: HttpsConnector<QuickAckConnector>,
    limit: Duration,
}

impl tower_service::Service<http::Uri> for Timed {
    type Response = <HttpsConnector<QuickAckConnector> as tower_service::Service<http::Uri>>::Response;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.connector.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let (connecting, limit) = (self.connector.call(uri), self.limit);
        Box::pin(async move {
            match tokio::time::timeout(limit, connecting).await {
                Ok(connected) => connected,
                Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out").into()),
            }
        })
    }
}

/// Opens TCP connections as hyper's own connector does, and wraps them.
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

/// Whether this system lets a socket acknowledge at once.
const QUICK_ACK: bool = cfg!(any(target_os = "linux", target_os = "android"));

/// A TCP stream that acknowledges what it read at once.
struct QuickAck(TcpStream);

impl AsyncRead for QuickAck {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.0).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            acknowledge_now(&self.0);
        }
        read
    }
}

/// Sends the ACK of what was read now, not after the delayed-ACK timer.
fn acknowledge_now(stream: &TcpStream) {
    // Linux clears the option on its own; a failure only costs the 40 ms it would.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = socket2::SockRef::from(stream).set_tcp_quickack(true);
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = stream;
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

#[cfg(all(test, any(target_os = "linux", target_os = "android")))]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// Reads requests with a body of two bytes off `stream`, and answers each with `answer`
    /// (`None`: closes the connection instead).
    async fn serve(mut stream: TcpStream, answer: Option<[&'static str; 2]>) {
        let mut request = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            let Ok(read @ 1..) = stream.read(&mut buffer).await else {
                return;
            };
            request.extend_from_slice(&buffer[..read]);
            let Some(head) = request.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            if request.len() < head + 4 + 2 {
                continue;
            }
            request.clear();
            let Some(parts) = answer else {
                return;
            };
            // Two writes, as rmcp's server makes: an event stream's priming event, then the
            // answer. With Nagle on, the second waits for the ACK of the first.
            for part in parts {
                if stream.write_all(part.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    }

    /// A server that leaves Nagle on, answering as `serve` does; its address and the number
    /// of connections it accepted.
    async fn server(answer: Option<[&'static str; 2]>) -> (url::Url, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = url::Url::parse(&format!("http://{}/mcp", listener.local_addr().unwrap()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, answer));
            }
        });
        (url.unwrap(), accepted)
    }

    const EVENTS: [&str; 2] = [
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
         transfer-encoding: chunked\r\n\r\n3\r\n:\n\n\r\n",
        "a\r\ndata: {}\n\n\r\n0\r\n\r\n",
    ];

    fn body() -> Bytes {
        Bytes::from_static(b"{}")
    }

    /// Without the quick ACK every call after the first waits ~40 ms for the server's second
    /// write (measured: 20 calls in ~840 ms); with it the calls take microseconds each.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kept_connection_answers_without_the_delayed_ack() {
        let (url, accepted) = server(Some(EVENTS)).await;
        let kept = KeptConnections::without_proxies(Duration::from_secs(5));
        let uri = kept.serves(&url).expect("plain HTTP, no proxy");
        let started = Instant::now();
        for _ in 0..20 {
            let response = kept.post(uri.clone(), http::HeaderMap::new(), body()).await.unwrap();
            assert_eq!(response.bytes().await.unwrap(), ":\n\ndata: {}\n\n");
        }
        let took = started.elapsed();
        // A connection a call is what reqwest's client (pool off) does. hyper may open a second
        // one when a call starts before the last has gone back to the pool.
        let accepted = accepted.load(Ordering::SeqCst);
        assert!(accepted < 10, "{accepted} connections for 20 calls");
        assert!(took < Duration::from_millis(400), "20 calls took {took:?}");
    }

    /// Only a call that no connection could carry reads as not sent (the call path may send
    /// it again); one the server took and dropped may have run.
    #[tokio::test]
    async fn only_a_refused_connection_reads_as_nothing_sent() {
        let kept = KeptConnections::without_proxies(Duration::from_secs(5));
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let refused = url::Url::parse(&format!("http://{closed}/mcp")).unwrap();
        let uri = kept.serves(&refused).unwrap();
        let error = kept.post(uri, http::HeaderMap::new(), body()).await.unwrap_err();
        assert!(error.sent_nothing(), "{error}");
        let (url, _) = server(None).await;
        let uri = kept.serves(&url).unwrap();
        let error = kept.post(uri, http::HeaderMap::new(), body()).await.unwrap_err();
        assert!(!error.sent_nothing(), "{error}");
    }

    #[test]
    fn only_urls_without_credentials_or_a_proxy_are_served() {
        let kept = KeptConnections::without_proxies(Duration::from_secs(1));
        let url = |text: &str| url::Url::parse(text).unwrap();
        assert!(kept.serves(&url("http://example.com/mcp")).is_some());
        assert!(kept.serves(&url("https://example.com/mcp")).is_some());
        assert!(kept.serves(&url("ftp://example.com/mcp")).is_none());
        assert!(kept.serves(&url("http://user:secret@example.com/mcp")).is_none());
        let proxied = KeptConnections {
            proxies: Arc::new(
                Matcher::builder()
                    .http("http://proxy.example:3128")
                    .no("localhost")
                    .build(),
            ),
            ..kept
        };
        assert!(proxied.serves(&url("http://example.com/mcp")).is_none());
        assert!(proxied.serves(&url("http://localhost:8080/mcp")).is_some());
    }
}
