//! The HTTP client transports (Streamable HTTP, legacy SSE, auto fallback) against the real
//! fixture server and a few tiny misbehaving responders: sessions work, end promptly when the
//! server restarts or dies, and every failure is classified into the right fault.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use rmcp::{
    RoleClient,
    model::{CallToolRequest, CallToolRequestParams, ClientRequest},
    service::{PeerRequestOptions, RunningService},
};
use serde_json::json;
use tether::transport::{
    Fault,
    http::{self, HttpFlavor, HttpOptions, HttpSession, classify_service_error, connect_session},
};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    net::TcpListener,
    process::{Child, Command},
};

const FIXTURE: &str = env!("CARGO_BIN_EXE_mcp-fixture");
/// How long anything may take on a loaded 2-core machine before a test fails.
const PATIENCE: Duration = Duration::from_secs(20);
/// What "promptly" means for a failure the transport must detect by itself.
const PROMPTLY: Duration = Duration::from_secs(5);

fn options() -> HttpOptions {
    HttpOptions {
        headers: BTreeMap::new(),
        connect_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(10),
        max_message: tether::config::ServerSpec::DEFAULT_MAX_MESSAGE,
        keep_connections: false,
        lifecycle: tether::transport::generation::lifecycle(Default::default(), None),
        routes: None,
        auth: None,
    }
}

struct Fixture {
    child: Child,
    addr: SocketAddr,
}

impl Fixture {
    /// Starts `mcp-fixture --transport <transport>` on `bind` and waits for its address.
    async fn start(transport: &str, state: &Path, bind: &str, flags: &[&str]) -> Fixture {
        let mut child = Command::new(FIXTURE)
            .args(["--transport", transport, "--bind", bind, "--state-dir"])
            .arg(state)
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn mcp-fixture");
        let stdout = child.stdout.take().expect("stdout is piped");
        let line = tokio::time::timeout(PATIENCE, BufReader::new(stdout).lines().next_line())
            .await
            .expect("the fixture announces its address in time")
            .expect("read the fixture's stdout")
            .expect("the fixture printed a line");
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|addr| addr.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line: {line}"));
        Fixture { child, addr }
    }

    fn mcp_url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    fn sse_url(&self) -> String {
        format!("http://{}/sse", self.addr)
    }

    async fn kill(mut self) {
        self.child.kill().await.expect("kill the fixture");
    }
}

fn echo(text: &str) -> CallToolRequestParams {
    let arguments = json!({ "text": text });
    CallToolRequestParams::new("echo")
        .with_arguments(arguments.as_object().cloned().unwrap_or_default())
}

/// Lists the tools and calls echo: the session works end to end.
async fn exercise(service: &RunningService<RoleClient, ()>) {
    let tools = tokio::time::timeout(PATIENCE, service.list_all_tools())
        .await
        .expect("tools/list in time")
        .expect("tools/list succeeds");
    let names: Vec<_> = tools.iter().map(|tool| tool.name.to_string()).collect();
    assert!(
        names.contains(&"echo".to_owned()) && names.contains(&"add".to_owned()),
        "{names:?}"
    );
    assert_eq!(
        call_echo(service, "hello").await.expect("echo succeeds"),
        "hello"
    );
}

async fn call_echo(
    service: &RunningService<RoleClient, ()>,
    text: &str,
) -> Result<String, rmcp::ServiceError> {
    let result = tokio::time::timeout(PATIENCE, service.call_tool(echo(text)))
        .await
        .expect("the call ends in time (no hang)")?;
    let result = serde_json::to_value(&result).expect("results serialize");
    Ok(result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned())
}

async fn close(mut service: RunningService<RoleClient, ()>) {
    let _ = tokio::time::timeout(PATIENCE, service.close()).await;
}

#[tokio::test]
async fn streamable_lists_tools_and_calls() {
    let state = tempfile::tempdir().unwrap();
    let fixture = Fixture::start("http", state.path(), "127.0.0.1:0", &[]).await;
    let service = http::connect_streamable(&fixture.mcp_url(), &options(), ())
        .await
        .expect("connects");
    exercise(&service).await;
    close(service).await;
    fixture.kill().await;
}

/// The connections to `port` this machine knows of, open or closed within the last minute (one
/// end stays in TIME_WAIT): their client ports.
fn connections_to(port: u16) -> std::collections::HashSet<u16> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let port_of = |address: &str| {
        let (_, port) = address.rsplit_once(':')?;
        u16::from_str_radix(port, 16).ok()
    };
    let mut clients = std::collections::HashSet::new();
    for line in table.lines().skip(1) {
        let columns: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(remote)) = (
            columns.get(1).and_then(|a| port_of(a)),
            columns.get(2).and_then(|a| port_of(a)),
        ) else {
            continue;
        };
        if remote == port {
            clients.insert(local);
        } else if local == port && remote != 0 {
            clients.insert(remote);
        }
    }
    clients
}

/// Calls `echo` `calls` times on a fresh session with `options`: the connections to the fixture
/// they opened, and how long they took.
async fn echo_calls(options: &HttpOptions, calls: u32) -> (usize, Duration) {
    let state = tempfile::tempdir().unwrap();
    let fixture = Fixture::start("http", state.path(), "127.0.0.1:0", &[]).await;
    let service = http::connect_streamable(&fixture.mcp_url(), options, ())
        .await
        .expect("connects");
    call_echo(&service, "warm").await.expect("echo");
    let before = connections_to(fixture.addr.port());
    let started = Instant::now();
    for _ in 0..calls {
        assert_eq!(call_echo(&service, "hi").await.expect("echo"), "hi");
    }
    let took = started.elapsed();
    let opened = connections_to(fixture.addr.port())
        .difference(&before)
        .count();
    close(service).await;
    fixture.kill().await;
    (opened, took)
}

/// With `keep_connections`, tool calls reuse their connections, and a server that leaves Nagle
/// on (the fixture does, on rmcp's and axum's defaults) does not hold each answer for a delayed
/// ACK (~40 ms a call). By default every call opens its own, as rmcp's client does.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn tool_calls_keep_their_connections_only_when_asked_and_without_delayed_acks() {
    const CALLS: u32 = 30;
    let (opened, _) = echo_calls(&options(), CALLS).await;
    assert!(
        opened >= CALLS as usize,
        "by default, {CALLS} calls opened {opened} connections"
    );
    let kept = HttpOptions {
        keep_connections: true,
        ..options()
    };
    let (opened, took) = echo_calls(&kept, CALLS).await;
    // hyper may open a second connection when a call starts before the last has gone back to
    // the pool.
    assert!(opened < 10, "{CALLS} calls opened {opened} connections");
    // Waiting for delayed ACKs would take at least 29 × 40 ms.
    assert!(
        took < Duration::from_millis(800),
        "{CALLS} calls took {took:?}"
    );
}

#[tokio::test]
async fn sse_lists_tools_and_calls() {
    let state = tempfile::tempdir().unwrap();
    let fixture = Fixture::start("sse", state.path(), "127.0.0.1:0", &[]).await;
    let service = http::connect_sse(&fixture.sse_url(), &options(), ())
        .await
        .expect("connects");
    exercise(&service).await;
    close(service).await;
    fixture.kill().await;
}

#[tokio::test]
async fn auto_falls_back_to_sse_and_reports_the_flavor() {
    let state = tempfile::tempdir().unwrap();
    let sse = Fixture::start("sse", state.path(), "127.0.0.1:0", &[]).await;
    let (service, flavor) = http::connect_auto(&sse.sse_url(), &options(), || ())
        .await
        .expect("falls back to SSE");
    assert_eq!(flavor, HttpFlavor::Sse);
    exercise(&service).await;
    close(service).await;
    sse.kill().await;

    let streamable = Fixture::start("http", state.path(), "127.0.0.1:0", &[]).await;
    let (service, flavor) = http::connect_auto(&streamable.mcp_url(), &options(), || ())
        .await
        .expect("connects");
    assert_eq!(flavor, HttpFlavor::Streamable);
    exercise(&service).await;
    close(service).await;
    streamable.kill().await;
}

/// A call the server never answers fails at the caller's deadline (rmcp then cancels its
/// POST), and the session keeps serving: nothing in the transport wedges.
#[tokio::test]
async fn unanswered_call_times_out_and_the_session_keeps_serving() {
    let state = tempfile::tempdir().unwrap();
    for (transport, path) in [("http", "mcp"), ("sse", "sse")] {
        let fixture = Fixture::start(transport, state.path(), "127.0.0.1:0", &[]).await;
        let url = format!("http://{}/{path}", fixture.addr);
        let (service, _) = http::connect_auto(&url, &options(), || ())
            .await
            .expect("connects");
        let deadline = Duration::from_millis(300);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new("hang"),
        ));
        let started = Instant::now();
        let handle = service
            .send_request_with_option(request, PeerRequestOptions::with_timeout(deadline))
            .await
            .expect("the request is sent");
        let error = tokio::time::timeout(PATIENCE, handle.await_response())
            .await
            .expect("the deadline applies")
            .expect_err("hang never answers");
        assert!(
            matches!(error, rmcp::ServiceError::Timeout { .. }),
            "{error:?}"
        );
        assert!(started.elapsed() < PROMPTLY, "took {:?}", started.elapsed());
        assert_eq!(
            classify_service_error(&error),
            None,
            "a timeout is not a transport fault"
        );
        assert_eq!(call_echo(&service, "still").await.expect("echo"), "still");
        close(service).await;
        fixture.kill().await;
    }
}

/// Connects, proves the session, then restarts the fixture on the same port with `flags`.
async fn session_across_restart(flags: &[&str]) -> (HttpSession<()>, Fixture, tempfile::TempDir) {
    let state = tempfile::tempdir().unwrap();
    let first = Fixture::start("http", state.path(), "127.0.0.1:0", flags).await;
    let addr = first.addr;
    let session = connect_session(
        &first.mcp_url(),
        Some(HttpFlavor::Streamable),
        &options(),
        || (),
    )
    .await
    .expect("connects");
    assert_eq!(
        call_echo(&session.service, "before").await.expect("echo"),
        "before"
    );
    first.kill().await;
    let second = Fixture::start("http", state.path(), &addr.to_string(), flags).await;
    (session, second, state)
}

#[tokio::test]
async fn restarted_server_expires_the_session_on_404() {
    let (session, fixture, _state) = session_across_restart(&[]).await;
    let started = Instant::now();
    let error = call_echo(&session.service, "after")
        .await
        .expect_err("the old session is gone");
    assert!(started.elapsed() < PROMPTLY, "took {:?}", started.elapsed());
    // The call either hit the 404 itself or found the session already ended by it.
    let fault = classify_service_error(&error).expect("a transport fault");
    assert!(
        fault == Fault::SessionExpired || matches!(fault, Fault::TransportClosed(_)),
        "{fault:?}"
    );
    assert_eq!(session.end.fault(), Some(Fault::SessionExpired));
    tokio::time::timeout(PROMPTLY, session.service.waiting())
        .await
        .expect("the session ends")
        .expect("the service task ends cleanly");
    fixture.kill().await;
}

/// A 400 whose JSON-RPC error names no request fails the call at once. The transport does not
/// end the session for it: servers answer so for a request they refuse too, and the session's
/// owner asks the session again to tell which (`supervision_http`: a forgotten session is
/// replaced, a refused request keeps it).
#[tokio::test]
async fn restarted_server_answering_400_without_id_fails_the_call_fast() {
    let (session, fixture, _state) =
        session_across_restart(&["--http-unknown-session", "400"]).await;
    let started = Instant::now();
    let error = call_echo(&session.service, "after")
        .await
        .expect_err("the old session is rejected");
    assert!(started.elapsed() < PROMPTLY, "took {:?}", started.elapsed());
    assert!(
        matches!(
            classify_service_error(&error),
            Some(Fault::TransportClosed(_))
        ),
        "{error:?}"
    );
    assert_eq!(session.end.fault(), None, "the verdict is the owner's");
    close(session.service).await;
    fixture.kill().await;
}

#[tokio::test]
async fn killed_sse_server_ends_the_session() {
    let state = tempfile::tempdir().unwrap();
    let fixture = Fixture::start("sse", state.path(), "127.0.0.1:0", &[]).await;
    let session = connect_session(&fixture.sse_url(), Some(HttpFlavor::Sse), &options(), || ())
        .await
        .expect("connects");
    assert_eq!(
        call_echo(&session.service, "before").await.expect("echo"),
        "before"
    );
    fixture.kill().await;
    tokio::time::timeout(PROMPTLY, session.end.ended())
        .await
        .expect("the stream's end is noticed");
    assert!(matches!(
        session.end.fault(),
        Some(Fault::TransportClosed(_))
    ));
    let started = Instant::now();
    let error = call_echo(&session.service, "after")
        .await
        .expect_err("no server");
    assert!(started.elapsed() < PROMPTLY, "took {:?}", started.elapsed());
    assert!(matches!(
        classify_service_error(&error),
        Some(Fault::TransportClosed(_))
    ));
    tokio::time::timeout(PROMPTLY, session.service.waiting())
        .await
        .expect("the session ends")
        .expect("the service task ends cleanly");
}

#[tokio::test]
async fn failing_initialize_is_a_handshake_failure() {
    let state = tempfile::tempdir().unwrap();
    let fixture = Fixture::start(
        "http",
        state.path(),
        "127.0.0.1:0",
        &["--fail-initializes", "1"],
    )
    .await;
    let fault = http::connect_streamable(&fixture.mcp_url(), &options(), ())
        .await
        .expect_err("the first initialize fails");
    assert!(matches!(fault, Fault::HandshakeFailed(_)), "{fault:?}");
    // The next attempt is served.
    let service = http::connect_streamable(&fixture.mcp_url(), &options(), ())
        .await
        .expect("the second initialize succeeds");
    close(service).await;
    fixture.kill().await;
}

/// An address nothing listens on.
async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

#[tokio::test]
async fn connection_refused_is_transport_closed() {
    let addr = closed_port().await;
    for flavor in [HttpFlavor::Streamable, HttpFlavor::Sse] {
        let fault = connect_session(
            &format!("http://{addr}/mcp"),
            Some(flavor),
            &options(),
            || (),
        )
        .await
        .err()
        .expect("nothing listens");
        assert!(
            matches!(fault, Fault::TransportClosed(_)),
            "{flavor:?}: {fault:?}"
        );
    }
}

/// Serves `status`, `content_type` and `body` to every request, until dropped.
struct Responder {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Responder {
    async fn start(status: u16, content_type: &'static str, body: &'static str) -> Responder {
        Self::start_with(move |_headers| (status, content_type, body)).await
    }

    /// Answers each request with what `answer` makes of its headers.
    async fn start_with(
        answer: impl Fn(&axum::http::HeaderMap) -> (u16, &'static str, &'static str)
        + Clone
        + Send
        + Sync
        + 'static,
    ) -> Responder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
            let (status, content_type, body) = answer(&headers);
            async move {
                axum::http::Response::builder()
                    .status(status)
                    .header("content-type", content_type)
                    .body(axum::body::Body::from(body))
                    .unwrap()
            }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Responder { addr, task }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Options whose headers and URL carry secrets that must never show in a fault.
fn secret_options() -> HttpOptions {
    let mut options = options();
    options
        .headers
        .insert("Authorization".into(), "Bearer header-secret".into());
    options
}

fn secret_url(addr: SocketAddr) -> String {
    format!("http://user:userinfo-secret@{addr}/mcp?token=query-secret")
}

fn assert_no_secrets(fault: &Fault) {
    let text = format!("{fault:?}");
    for secret in ["header-secret", "userinfo-secret", "query-secret"] {
        assert!(!text.contains(secret), "{secret} leaked: {text}");
    }
}

#[tokio::test]
async fn unauthorized_and_forbidden_are_auth_required() {
    for status in [401, 403] {
        let responder = Responder::start(status, "text/plain", "go away").await;
        for flavor in [HttpFlavor::Streamable, HttpFlavor::Sse] {
            let fault = connect_session(
                &secret_url(responder.addr),
                Some(flavor),
                &secret_options(),
                || (),
            )
            .await
            .err()
            .expect("refused");
            assert_eq!(fault, Fault::AuthRequired(status), "{flavor:?}");
        }
        // Auto mode does not fall back on auth failures.
        let fault = http::connect_auto(&secret_url(responder.addr), &secret_options(), || ())
            .await
            .expect_err("refused");
        assert_eq!(fault, Fault::AuthRequired(status));
    }
}

#[tokio::test]
async fn configured_headers_are_sent() {
    let responder = Responder::start_with(|headers| {
        match headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
            Some("k1") => (200, "text/html", "<html>welcome</html>"),
            _ => (401, "text/plain", "no key"),
        }
    })
    .await;
    let url = format!("http://{}/mcp", responder.addr);
    let fault = http::connect_streamable(&url, &options(), ())
        .await
        .expect_err("no key");
    assert_eq!(fault, Fault::AuthRequired(401));
    let mut with_key = options();
    with_key.headers.insert("X-Api-Key".into(), "k1".into());
    let fault = http::connect_streamable(&url, &with_key, ())
        .await
        .expect_err("HTML");
    assert!(matches!(fault, Fault::NotMcpEndpoint(_)), "{fault:?}");
}

#[tokio::test]
async fn html_answers_are_not_mcp_endpoints() {
    for status in [200, 404] {
        let responder = Responder::start(status, "text/html", "<html>hello</html>").await;
        for flavor in [Some(HttpFlavor::Streamable), Some(HttpFlavor::Sse), None] {
            let fault = connect_session(
                &secret_url(responder.addr),
                flavor,
                &secret_options(),
                || (),
            )
            .await
            .err()
            .expect("not MCP");
            assert!(
                matches!(fault, Fault::NotMcpEndpoint(_)),
                "{status} {flavor:?}: {fault:?}"
            );
            assert_no_secrets(&fault);
        }
    }
}

#[tokio::test]
async fn silent_server_times_out_the_handshake() {
    // Accepts connections and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let mut quick = options();
    quick.connect_timeout = Duration::from_millis(500);
    for flavor in [Some(HttpFlavor::Streamable), Some(HttpFlavor::Sse), None] {
        let started = Instant::now();
        let fault = connect_session(&format!("http://{addr}/mcp"), flavor, &quick, || ())
            .await
            .err()
            .expect("no answer");
        assert_eq!(fault, Fault::HandshakeTimedOut, "{flavor:?}");
        assert!(started.elapsed() < PROMPTLY, "took {:?}", started.elapsed());
    }
    hold.abort();
}

#[tokio::test]
async fn invalid_urls_are_refused() {
    for url in ["not a url", "ftp://127.0.0.1/mcp"] {
        let fault = http::connect_streamable(url, &options(), ())
            .await
            .expect_err("refused");
        assert!(
            matches!(fault, Fault::NotMcpEndpoint(_)),
            "{url}: {fault:?}"
        );
    }
}
