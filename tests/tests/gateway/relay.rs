//! What crosses Tether between a client and an upstream, seen on the wire: every progress
//! notification of a call, in order, before its answer, for clients and upstreams of both
//! generations; resource subscriptions across generations; a first answer that waits for the
//! servers still starting (and later answers that never wait); and a result that reaches a stdio
//! agent as a stdio server wrote it.

#![allow(deprecated)] // resources/subscribe is legacy-only, and what an older client uses

use std::time::{Duration, Instant};

use rmcp::model::{ReadResourceRequestParams, SubscribeRequestParams};
use rmcp::service::NotificationContext;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};

use super::*;

/// A raw MCP-over-HTTP client: each answer's server-sent events read in order, as sent.
struct Wire {
    http: reqwest::Client,
    url: String,
    /// The legacy session, once initialized.
    session: Option<String>,
    modern: bool,
    /// What `initialize` declares.
    capabilities: Value,
}

impl Wire {
    fn new(url: &str, modern: bool) -> Self {
        Self {
            http: reqwest::Client::new(),
            url: url.to_string(),
            session: None,
            modern,
            capabilities: json!({}),
        }
    }

    /// A 2025-11-25 session: `initialize`, then `notifications/initialized`.
    async fn initialize(&mut self) {
        let (headers, _) = self
            .post(
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": self.capabilities,
                    "clientInfo": {"name": "wire", "version": "1"},
                }}),
            )
            .await;
        self.session = headers
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        assert!(self.session.is_some(), "a session id");
        self.post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
    }

    /// POSTs `message` and reads the answer to its end: every JSON-RPC message in order.
    async fn post(&self, message: Value) -> (reqwest::header::HeaderMap, Vec<Value>) {
        let (headers, body) = self.post_text(message).await;
        let messages = body
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(str::trim)
            .chain(body.trim().starts_with('{').then_some(body.trim()))
            .filter_map(|data| serde_json::from_str::<Value>(data).ok())
            .collect();
        (headers, messages)
    }

    /// The name the gateway lists a tool under whose name ends with `suffix`.
    async fn tool_ending(&self, suffix: &str) -> String {
        let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
        let (_, listed) = self.post(list).await;
        let tools = listed.last().expect("the list")["result"]["tools"].clone();
        let names = tools.as_array().expect("tools").iter();
        let mut names = names.filter_map(|tool| tool["name"].as_str());
        let name = names.find(|name| name.ends_with(suffix));
        name.unwrap_or_else(|| panic!("no tool ending {suffix:?} in {tools}"))
            .to_string()
    }

    /// A 2025-11-25 session, and the name the gateway lists the tool ending `suffix` under.
    async fn session_with(url: &str, suffix: &str) -> (Self, String) {
        let mut wire = Self::new(url, false);
        wire.initialize().await;
        let tool = wire.tool_ending(suffix).await;
        (wire, tool)
    }

    /// The first chunk of `response`'s body (an event stream's priming event), as text.
    async fn first_chunk(response: &mut reqwest::Response) -> String {
        let first = tokio::time::timeout(PATIENCE, response.chunk())
            .await
            .expect("the first event in time")
            .expect("the stream")
            .expect("an event");
        String::from_utf8(first.to_vec()).unwrap()
    }

    /// Calls `slow` for `ms` as request `id`: the response, and its first chunk.
    async fn sleep_on(&self, slow: &str, id: u64, ms: u64) -> (reqwest::Response, String) {
        let mut response = self
            .open(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": slow, "arguments": {"ms": ms}}}))
            .await;
        let first = Self::first_chunk(&mut response).await;
        (response, first)
    }

    /// POSTs `message` on the 2025-11-25 session: the response, its body still to read.
    async fn open(&self, message: Value) -> reqwest::Response {
        self.open_with(message, &[]).await
    }

    /// As [`Wire::open`], with `headers` added or in place of the usual ones.
    async fn open_with(&self, message: Value, headers: &[(&str, &str)]) -> reqwest::Response {
        let json = [("content-type", "application/json")];
        let headers: Vec<_> = json.into_iter().chain(headers.iter().copied()).collect();
        self.open_with_body(message.to_string().into(), &headers)
            .await
    }

    /// As [`Wire::open`], its body sent in two chunks (no length said).
    async fn open_in_chunks(&self, message: Value) -> reqwest::Response {
        let text = message.to_string();
        let chunks = [text[..10].to_string(), text[10..].to_string()];
        let chunks = futures::stream::iter(chunks.map(Ok::<_, std::io::Error>));
        let json = [("content-type", "application/json")];
        self.open_with_body(reqwest::Body::wrap_stream(chunks), &json)
            .await
    }

    /// POSTs `body` on the 2025-11-25 session with the usual headers and `headers`.
    async fn open_with_body(
        &self,
        body: reqwest::Body,
        headers: &[(&str, &str)],
    ) -> reqwest::Response {
        let session = self.session.as_deref().expect("a session");
        let usual = [
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2025-11-25"),
            ("mcp-session-id", session),
        ];
        let mut request = self.http.post(&self.url).body(body);
        for (name, value) in usual {
            if !headers.iter().any(|(given, _)| *given == name) {
                request = request.header(name, value);
            }
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send().await.expect("the POST")
    }

    /// Picks a stream of the 2025-11-25 session up again after event `last_event_id`.
    async fn pick_up(&self, last_event_id: &str) -> reqwest::Response {
        self.pick_up_as(last_event_id, Some("2025-11-25")).await
    }

    /// [`Self::pick_up`] with `version` as the `MCP-Protocol-Version` header (`None`: none).
    async fn pick_up_as(&self, last_event_id: &str, version: Option<&str>) -> reqwest::Response {
        let session = self.session.as_deref().expect("a session");
        let mut request = self
            .http
            .get(&self.url)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", session)
            .header("last-event-id", last_event_id);
        if let Some(version) = version {
            request = request.header("mcp-protocol-version", version);
        }
        let response = request.send().await.expect("the stream picked up again");
        assert!(response.status().is_success(), "{}", response.status());
        response
    }

    /// POSTs `message` and reads the answer's body to its end, as it came.
    async fn post_text(&self, mut message: Value) -> (reqwest::header::HeaderMap, String) {
        let mut request = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json");
        if self.modern {
            let method = message["method"].as_str().unwrap_or_default().to_string();
            let meta = json!({
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
            });
            let params = message["params"].as_object_mut().expect("params");
            let mut merged = meta.as_object().unwrap().clone();
            if let Some(Value::Object(own)) = params.remove("_meta") {
                merged.extend(own);
            }
            params.insert("_meta".into(), Value::Object(merged));
            request = request
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", &method);
            if let Some(name) = message["params"]["name"].as_str() {
                request = request.header("mcp-name", name);
            }
        } else {
            request = request.header("mcp-protocol-version", "2025-11-25");
            if let Some(session) = &self.session {
                request = request.header("mcp-session-id", session);
            }
        }
        let response = tokio::time::timeout(PATIENCE, request.json(&message).send())
            .await
            .expect("an answer in time")
            .expect("the gateway answers");
        let headers = response.headers().clone();
        let body = body_in_time(response).await;
        (headers, body)
    }
}

/// The ids of the events of an event stream's `body`, in order.
fn event_ids(body: &str) -> Vec<&str> {
    body.lines()
        .filter_map(|line| line.strip_prefix("id: "))
        .collect()
}

/// Calls `tool` with a progress token and checks what came back: `n` progress notifications
/// with the client's token, values 1..=n in order, all before the answer.
async fn assert_every_progress_in_order(wire: &Wire, tool: &str, n: u64) {
    let (_, messages) = wire
        .post(
            json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
                "name": tool, "arguments": {"n": n}, "_meta": {"progressToken": "the-client's"},
            }}),
        )
        .await;
    let answer_at = messages
        .iter()
        .position(|m| m["id"] == 7)
        .unwrap_or_else(|| panic!("no answer to the call: {messages:?}"));
    assert!(
        messages[answer_at]["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("sent")),
        "{:?}",
        messages[answer_at]
    );
    let progress: Vec<f64> = messages[..answer_at]
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| {
            assert_eq!(m["params"]["progressToken"], "the-client's", "{m}");
            m["params"]["progress"].as_f64().unwrap()
        })
        .collect();
    let expected: Vec<f64> = (1..=n).map(|i| i as f64).collect();
    assert_eq!(
        progress, expected,
        "{tool}: every progress notification, in order, before the answer"
    );
    // Nothing of this call comes after its answer.
    assert!(
        messages[answer_at + 1..]
            .iter()
            .all(|m| m["method"] != "notifications/progress"),
        "{messages:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_progress_notification_reaches_the_client_in_order_before_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let state = |name: &str| {
        let path = dir.path().join(name);
        std::fs::create_dir_all(&path).unwrap();
        path.to_str().unwrap().to_string()
    };
    let (legacy, modern) = (state("legacy"), state("modern"));
    // Over HTTP the call is POSTed by Tether, and its progress comes on the POST's stream
    // before the answer (`transport/http/posted.rs`).
    let web_state = crate::common::StateDir(dir.path().join("web"));
    std::fs::create_dir_all(&web_state.0).unwrap();
    let web =
        crate::common::HttpFixture::start("http", &web_state, "127.0.0.1:0", &["--tools", "burst"])
            .await;
    let config = json!({"mcpServers": {
        "legacy": {"command": FIXTURE, "args": [
            "--transport", "stdio", "--state-dir", legacy, "--tools", "burst",
        ]},
        "modern": {"command": FIXTURE, "args": [
            "--transport", "stdio", "--state-dir", modern, "--tools", "burst", "--modern-only",
        ]},
        "web": {"url": format!("http://{}/mcp", web.addr), "type": "http", "protocol": "2025-11-25"},
    }});
    let path = dir.path().join("servers.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let (tether, url) = serve_http(dir.path(), &path).await;
    let mut old_client = Wire::new(&url, false);
    old_client.initialize().await;
    let new_client = Wire::new(&url, true);
    for client in [&old_client, &new_client] {
        for tool in ["legacy__burst", "modern__burst", "web__burst"] {
            // Enough that a race with the request's registration, or reordering, would show.
            assert_every_progress_in_order(client, tool, 200).await;
        }
    }
    assert!(terminate(tether).await.success());
}

/// Counts `notifications/resources/updated`.
#[derive(Clone, Default)]
struct Updates(Arc<Mutex<Vec<String>>>);

impl ClientHandler for Updates {
    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.0.lock().unwrap().push(params.uri);
    }
}

/// A 2025-11-25 client subscribes to a resource of a server Tether reaches on 2026-07-28 (where
/// updates come through `subscriptions/listen`), and a 2026-07-28 client listens to one of a
/// server reached on 2025-11-25 (`resources/subscribe`): both hear the update; both read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_and_reads_cross_generations() {
    let dir = tempfile::tempdir().unwrap();
    let fixture =
        crate::conformance_suite::ConformanceFixture::start(&dir.path().join("fixture.log")).await;
    let config = json!({"mcpServers": {
        "modern": {"url": fixture.url, "type": "http", "protocol": "2026-07-28"},
        "legacy": {"url": fixture.url, "type": "http", "protocol": "2025-11-25"},
    }});
    let path = dir.path().join("servers.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let watched = "test://watched-resource";
    // The fixture lists the URI twice (two servers): the old client's subscription goes to
    // `modern`, the new one's listens through `legacy`, one server visible at a time.
    for (visible, modern_client) in [("modern", false), ("legacy", true)] {
        let hidden = if visible == "modern" {
            "legacy"
        } else {
            "modern"
        };
        let mut config = config.clone();
        config["mcpServers"][hidden]["disabled"] = json!(true);
        std::fs::write(&path, config.to_string()).unwrap();
        let (tether, url) = serve_http(dir.path(), &path).await;
        let updates = Updates::default();
        let transport = rmcp::transport::StreamableHttpClientTransport::with_client(
            reqwest::Client::new(),
            rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                url.clone(),
            ),
        );
        let lifecycle = if modern_client {
            rmcp::ClientLifecycleMode::Discover {
                preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
            }
        } else {
            rmcp::ClientLifecycleMode::Initialize
        };
        let client =
            rmcp::ClientServiceExt::serve_with_lifecycle(updates.clone(), transport, lifecycle)
                .await
                .expect("a session with the gateway");
        let read = client
            .read_resource(ReadResourceRequestParams::new(watched))
            .await
            .unwrap_or_else(|e| panic!("{visible}: reading {watched}: {e}"));
        assert!(!read.contents.is_empty(), "{visible}: {read:?}");
        // A 2026-07-28 client hears of updates on its listen stream, an older one by callback.
        let mut listening = None;
        if modern_client {
            let filter = rmcp::model::SubscriptionFilter::builder()
                .resource_subscription(watched)
                .build();
            listening = Some(client.listen(filter).await.expect("listening"));
        } else {
            client
                .subscribe(SubscribeRequestParams::new(watched))
                .await
                .expect("subscribing through Tether");
        }
        // The subscription reaches the upstream asynchronously: bump until an update comes.
        let deadline = Instant::now() + PATIENCE;
        let heard = loop {
            client
                .call_tool(rmcp::model::CallToolRequestParams::new(format!(
                    "{visible}__test_update_watched_resource"
                )))
                .await
                .expect("the update tool");
            let heard = match &mut listening {
                Some(stream) => {
                    let mut heard = None;
                    while let Ok(Ok(Some(notification))) =
                        tokio::time::timeout(Duration::from_millis(300), stream.next()).await
                    {
                        if let rmcp::model::ServerNotification::ResourceUpdatedNotification(n) =
                            notification
                        {
                            heard = Some(n.params.uri);
                            break;
                        }
                    }
                    heard
                }
                None => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    updates.0.lock().unwrap().first().cloned()
                }
            };
            if let Some(uri) = heard {
                break uri;
            }
            assert!(
                Instant::now() < deadline,
                "{visible} (client modern: {modern_client}): no update reached the client"
            );
        };
        assert_eq!(heard, watched);
        let _ = client.cancel().await;
        assert!(terminate(tether).await.success());
    }
}

/// A client that declared neither sampling nor elicitation calls tools whose servers (of either
/// generation) ask for them: each call ends at once with an error naming the capability the
/// client lacks, never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_cannot_answer_what_a_server_asks_gets_a_clear_error_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fixture =
        crate::conformance_suite::ConformanceFixture::start(&dir.path().join("fixture.log")).await;
    let config = json!({"mcpServers": {
        "modern": {"url": fixture.url, "type": "http", "protocol": "2026-07-28"},
        "legacy": {"url": fixture.url, "type": "http", "protocol": "2025-11-25"},
    }});
    let path = dir.path().join("servers.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let (tether, url) = serve_http(dir.path(), &path).await;
    for (modern_client, server) in [(false, "legacy"), (false, "modern"), (true, "legacy")] {
        let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.clone());
        let lifecycle = if modern_client {
            rmcp::ClientLifecycleMode::Discover {
                preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
            }
        } else {
            rmcp::ClientLifecycleMode::Initialize
        };
        // `()` declares no capability at all.
        let client = rmcp::ClientServiceExt::serve_with_lifecycle((), transport, lifecycle)
            .await
            .expect("a session with the gateway");
        for (tool, capability) in [
            ("test_sampling", "sampling"),
            ("test_elicitation", "elicitation"),
        ] {
            let name = format!("{server}__{tool}");
            let started = Instant::now();
            let mut params = rmcp::model::CallToolRequestParams::new(name.clone());
            params.arguments = Some(
                json!({"prompt": "say hi", "message": "your name?"})
                    .as_object()
                    .unwrap()
                    .clone(),
            );
            let answer = tokio::time::timeout(PATIENCE, client.call_tool(params))
                .await
                .unwrap_or_else(|_| panic!("{name} (client modern: {modern_client}) hung"));
            let words = match answer {
                Err(error) => error.to_string(),
                Ok(result) => {
                    assert_eq!(result.is_error, Some(true), "{name}: {result:?}");
                    serde_json::to_string(&result.content).unwrap()
                }
            };
            assert!(
                words.contains(&format!("did not declare the {capability} capability"))
                    || words.contains(&format!(
                        "needs {capability} from the client, which did not declare"
                    )),
                "{name} (client modern: {modern_client}): {words}"
            );
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{name}: {:?}",
                started.elapsed()
            );
        }
        let _ = client.cancel().await;
    }
    assert!(terminate(tether).await.success());
}

/// A client that lists once when it starts gets the tools of a server that takes a second to
/// start (stdio and HTTP alike); a server that never answers holds that first answer only for
/// the startup wait, and nothing after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_lists_once_at_start_gets_the_servers_still_starting() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("slow");
    std::fs::create_dir_all(&state).unwrap();
    let config = json!({"mcpServers": {
        "slow": {"command": FIXTURE, "args": [
            "--transport", "stdio", "--state-dir", state.to_str().unwrap(),
            "--startup-delay-ms", "1200",
        ]},
        // Answers nothing: its first attempt lasts until the connect timeout.
        "mute": {"command": "sleep", "args": ["3600"], "timeouts": {"connect": "60s"}},
    }});
    let path = dir.path().join("servers.json");
    std::fs::write(&path, config.to_string()).unwrap();

    // stdio: the agent starts the gateway and lists at once.
    let mut tether = serve(dir.path(), &path, &["--startup-wait", "4s"], None);
    let io = (tether.stdout.take().unwrap(), tether.stdin.take().unwrap());
    drain_stderr(&mut tether);
    let started = Instant::now();
    let client = ().serve(io).await.expect("MCP over stdio");
    let tools = client.list_all_tools().await.unwrap();
    let first = started.elapsed();
    assert!(
        tools.iter().any(|t| t.name == "slow__echo"),
        "the first list waits for the server starting: {tools:?}"
    );
    assert!(
        first < Duration::from_secs(10),
        "bounded by the wait: {first:?}"
    );
    // Later lists never wait, though `mute` is still on its first attempt.
    let again = Instant::now();
    client.list_all_tools().await.unwrap();
    assert!(
        again.elapsed() < Duration::from_millis(500),
        "{:?}",
        again.elapsed()
    );
    let _ = client.cancel().await;
    let _ = terminate(tether).await;

    // HTTP: a client that connects right after the gateway announced itself.
    let gateway = start_http(serve_command(
        dir.path(),
        &path,
        &["--http", "127.0.0.1:0", "--startup-wait", "4s"],
    ))
    .await;
    let client = ()
        .serve(rmcp::transport::StreamableHttpClientTransport::from_uri(
            gateway.url.clone(),
        ))
        .await
        .expect("MCP over HTTP");
    let tools = client.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "slow__echo"), "{tools:?}");
    let _ = client.cancel().await;
    assert!(terminate(gateway.tether).await.success());
}

/// What `mcp-hostile verbatim` answers its `big` tool with (`error`: its error result): JSON a
/// parser reads and a writer would not write back the same way (an escaped `é` and `/`, a number
/// with a trailing zero, a member no protocol generation defines).
const VERBATIM: &str = r#"{"content":[{"type":"text","text":"caf\u00e9 \/"}],"structuredContent":{"n":1.50},"x-note":"kept"}"#;
const VERBATIM_ERROR: &str = r#"{"content":[{"type":"text","text":"caf\u00e9 \/"}],"structuredContent":{"n":1.50},"isError":true}"#;

/// A response's whole body, which must end within [`PATIENCE`].
async fn body_in_time(response: reqwest::Response) -> String {
    tokio::time::timeout(PATIENCE, response.text())
        .await
        .expect("the body ends in time")
        .expect("a body")
}

/// A config of one server, `h`: `mcp-hostile` in `mode`.
fn hostile_servers(mode: &str) -> String {
    let hostile = env!("CARGO_BIN_EXE_mcp-hostile");
    json!({"mcpServers": {"h": {"command": hostile, "args": [mode]}}}).to_string()
}

/// A temp dir holding [`hostile_servers`] in `mode`, and the config's path.
fn hostile_config(mode: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("servers.json");
    std::fs::write(&config, hostile_servers(mode)).unwrap();
    (dir, config)
}

/// The name under which the gateway serves `mcp-hostile`'s `big` tool.
async fn big_tool(peer: &rmcp::Peer<RoleClient>) -> String {
    let tools = peer.list_all_tools().await.expect("tools/list");
    let big = tools.iter().find(|tool| tool.name.ends_with("big"));
    big.expect("the server's tools").name.to_string()
}

/// The bytes a stream carried, kept as they are read.
struct Tap<R> {
    inner: R,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Tap<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let fresh = buf.filled()[before..].to_vec();
        self.seen.lock().unwrap().extend_from_slice(&fresh);
        polled
    }
}

/// A server's burst of log messages reaches an agent in the order the server sent them, as
/// read off the agent's stdio (rmcp's loops hand each notification to a task of its own, and a
/// burst came out of order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_log_messages_reaches_the_agent_in_order() {
    const SENT: u64 = 150;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("servers.json");
    let hostile = env!("CARGO_BIN_EXE_mcp-hostile");
    let args = ["numbered-logs".to_string(), SENT.to_string()];
    let servers = json!({"mcpServers": {"h": {"command": hostile, "args": args}}});
    std::fs::write(&config, servers.to_string()).unwrap();
    let mut tether = serve(dir.path(), &config, &[], None);
    drain_stderr(&mut tether);
    let mut stdin = tether.stdin.take().unwrap();
    let mut stdout = BufReader::new(tether.stdout.take().unwrap()).lines();
    let requests = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel",
            "params": {"level": "debug"}}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
    ];
    for request in requests {
        stdin
            .write_all(format!("{request}\n").as_bytes())
            .await
            .unwrap();
    }
    // The level is set and the tool listed before the call.
    let mut answers = 0;
    while answers < 3 {
        let line = tokio::time::timeout(PATIENCE, stdout.next_line()).await;
        let line = line.expect("the answers in time").unwrap().expect("open");
        answers += usize::from(serde_json::from_str::<Value>(&line).unwrap()["id"].is_number());
    }
    let call = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
        "params": {"name": "h__big", "arguments": {}}});
    stdin
        .write_all(format!("{call}\n").as_bytes())
        .await
        .unwrap();
    let (mut logged, mut answered) = (Vec::new(), false);
    while !answered || (logged.len() as u64) < SENT {
        let line = tokio::time::timeout(PATIENCE, stdout.next_line()).await;
        let line = line
            .expect("the logs and the answer in time")
            .unwrap()
            .expect("open");
        let message: Value = serde_json::from_str(&line).unwrap();
        match message["method"].as_str() {
            Some("notifications/message") => logged.push(message["params"]["data"].clone()),
            _ => answered |= message["id"] == 4,
        }
    }
    let order: Vec<Value> = (0..SENT).map(Value::from).collect();
    assert_eq!(logged, order);
    drop(stdin);
    let _ = terminate(tether).await;
}

/// What serde cannot read gets what JavaScript and Python servers give. A JavaScript server that
/// cuts a string inside an emoji writes an unpaired surrogate escape, which JavaScript and
/// Python read and serde refuses: its answer reaches the agent with U+FFFD in that place, and an
/// agent's own such escape reaches the server the same way, where the line was dropped and the
/// call left waiting for its timeout. A request whose params its method cannot take is refused
/// as invalid params, not as a method Tether does not serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_serde_cannot_read_gets_what_javascript_and_python_servers_give() {
    let (dir, config) = hostile_config("lone-surrogate");
    let mut tether = serve(dir.path(), &config, &[], None);
    drain_stderr(&mut tether);
    let mut stdin = tether.stdin.take().unwrap();
    let mut stdout = BufReader::new(tether.stdout.take().unwrap()).lines();
    let mut ask = async |id: u32, method: &str, params: &str| -> Value {
        let line =
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#);
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        if method == "initialize" {
            let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
            stdin.write_all(initialized.as_bytes()).await.unwrap();
            stdin.write_all(b"\n").await.unwrap();
        }
        loop {
            let line = tokio::time::timeout(PATIENCE, stdout.next_line()).await;
            let line = line.expect("an answer in time").unwrap().expect("open");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == id {
                return message;
            }
        }
    };
    let init = r#"{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}"#;
    ask(1, "initialize", init).await;
    let listed = ask(2, "tools/list", "{}").await;
    assert!(listed.to_string().contains("h__big"), "{listed}");
    let text = |answer: &Value| answer["result"]["content"][0]["text"].clone();
    let answer = ask(3, "tools/call", r#"{"name":"h__big","arguments":{}}"#).await;
    assert_eq!(text(&answer), "Hi \u{fffd}", "{answer}");
    let params = r#"{"name":"h__echo","arguments":{"text":"cut \ud83d here"}}"#;
    let answer = ask(4, "tools/call", params).await;
    assert_eq!(text(&answer), "cut \u{fffd} here", "{answer}");
    for (id, method, params) in [
        (5, "tools/call", r#"{"arguments":{}}"#),
        (6, "resources/read", "{}"),
        (7, "logging/setLevel", r#"{"level":"loud"}"#),
    ] {
        let answer = ask(id, method, params).await;
        assert_eq!(answer["error"]["code"], -32602, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("invalid params for {method}: ")),
            "{message}"
        );
    }
    drop(stdin);
    let _ = terminate(tether).await;
}

/// An agent on `tether serve`'s stdio, of either generation, in front of a stdio server: a result
/// the agent gets unchanged reaches it as the server wrote it, byte for byte (a 2026-07-28
/// agent's with `resultType` first); an error result, whose words the policy reads, takes the
/// typed way and reaches it all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_reaches_a_stdio_agent_as_the_server_wrote_it() {
    let (dir, config) = hostile_config("verbatim");
    a_stdio_agent_reads_the_servers_bytes(dir.path(), &config).await;
}

/// What [`a_result_reaches_a_stdio_agent_as_the_server_wrote_it`] checks, for the servers of
/// `config` (one whose `big` tool answers as `mcp-hostile verbatim` does).
async fn a_stdio_agent_reads_the_servers_bytes(dir: &Path, config: &Path) {
    use rmcp::ClientServiceExt;
    use rmcp::model::{ProtocolVersion, ResultType};

    for modern in [false, true] {
        let mut tether = serve(dir, config, &[], None);
        drain_stderr(&mut tether);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let read = Tap {
            inner: tether.stdout.take().unwrap(),
            seen: seen.clone(),
        };
        let lifecycle = match modern {
            true => rmcp::ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
            false => rmcp::ClientLifecycleMode::Initialize,
        };
        let client =
            ().serve_with_lifecycle((read, tether.stdin.take().unwrap()), lifecycle)
                .await
                .expect("an MCP session on stdio");
        let big = big_tool(client.peer()).await;

        let result = client
            .peer()
            .call_tool(CallToolRequestParams::new(big.clone()))
            .await
            .expect("the call");
        assert_eq!(text(&result), "café /");
        assert_eq!(result.structured_content, Some(json!({"n": 1.5})));
        let expected = match modern {
            true => VERBATIM.replacen('{', r#"{"resultType":"complete","#, 1),
            false => VERBATIM.to_string(),
        };
        assert_eq!(result.result_type, modern.then_some(ResultType::COMPLETE));
        let wire = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
        assert!(
            wire.contains(&format!(r#""result":{expected}}}"#)),
            "modern: {modern}; the agent read: {wire}"
        );

        let failed = client
            .peer()
            .call_tool(
                CallToolRequestParams::new(big)
                    .with_arguments(args(json!({"error": true})).unwrap()),
            )
            .await
            .expect("the call");
        assert_eq!(failed.is_error, Some(true));
        assert_eq!(text(&failed), "café /");
        let wire = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
        assert!(!wire.contains(VERBATIM_ERROR), "typed, not passed: {wire}");
        drop(client);
        let _ = terminate(tether).await;
    }
}

/// An agent on Streamable HTTP, of either generation: a result it gets unchanged reaches it as
/// the server wrote it, byte for byte, from a stdio server and from an HTTP one (another Tether
/// in front of that stdio server, whose HTTP answers carry the bytes in turn); an error result,
/// whose words the policy reads, takes the typed way. A stdio agent in front of the HTTP server
/// gets the bytes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_reaches_an_http_agent_as_the_server_wrote_it() {
    let dir = tempfile::tempdir().unwrap();
    let [near, far, stdio] = ["near", "far", "stdio"].map(|name| dir.path().join(name));
    for place in [&near, &far, &stdio] {
        std::fs::create_dir(place).unwrap();
    }
    std::fs::write(near.join("servers.json"), hostile_servers("verbatim")).unwrap();
    let (first, first_url) = serve_http(&near, &near.join("servers.json")).await;
    let servers = json!({"mcpServers": {"h": {"url": first_url, "type": "http"}}});
    std::fs::write(far.join("servers.json"), servers.to_string()).unwrap();
    let (second, second_url) = serve_http(&far, &far.join("servers.json")).await;

    for url in [&first_url, &second_url] {
        for modern in [false, true] {
            let mut wire = Wire::new(url, modern);
            if !modern {
                wire.initialize().await;
            }
            let big = wire.tool_ending("big").await;
            let call = |id: u64, arguments: Value| {
                json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                    "params": {"name": big, "arguments": arguments}})
            };
            let (_, body) = wire.post_text(call(2, json!({}))).await;
            let expected = match modern {
                true => VERBATIM.replacen('{', r#"{"resultType":"complete","#, 1),
                false => VERBATIM.to_string(),
            };
            assert!(
                body.contains(&format!(
                    r#"{{"jsonrpc":"2.0","id":2,"result":{expected}}}"#
                )),
                "{url}, modern: {modern}; the agent read: {body}"
            );
            let (_, failed) = wire.post(call(3, json!({"error": true}))).await;
            let failed = failed.last().expect("the answer");
            assert_eq!(failed["result"]["isError"], json!(true), "{failed}");
            assert_eq!(failed["result"]["content"][0]["text"], json!("café /"));
            let (_, body) = wire.post_text(call(4, json!({"error": true}))).await;
            assert!(!body.contains(VERBATIM_ERROR), "typed, not passed: {body}");
        }
    }

    std::fs::write(stdio.join("servers.json"), servers.to_string()).unwrap();
    a_stdio_agent_reads_the_servers_bytes(&stdio, &stdio.join("servers.json")).await;
    let _ = terminate(second).await;
    let _ = terminate(first).await;
}

/// An agent on Streamable HTTP whose POST's connection closes while its call runs, and which
/// picks its stream up again (`Last-Event-ID`, without the version header, which rmcp does not
/// require on a GET), gets the tool's result there: the bytes could not go on the closed POST,
/// so the result goes decoded, not as Tether's stand-in. Picked up once more after that, the
/// stream gives the result again (the connection it went on may have died with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_reaches_an_http_agent_that_resumed_its_stream() {
    let (dir, _state, config) = one_upstream();
    let (tether, url) = serve_http(dir.path(), &config).await;
    let (wire, slow) = Wire::session_with(&url, "slow").await;
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": slow, "arguments": {"ms": 1500}}});
    let mut response = wire.open(call).await;
    // The stream's first event (its priming event) names where to pick it up again.
    let first = Wire::first_chunk(&mut response).await;
    let last_event = first
        .lines()
        .find_map(|line| line.strip_prefix("id:"))
        .map(|id| id.trim().to_string())
        .unwrap_or_else(|| panic!("an event id in {first:?}"));
    drop(response);
    let answer_on = |mut resumed: reqwest::Response| async move {
        let mut read = String::new();
        tokio::time::timeout(PATIENCE, async {
            loop {
                let chunk = resumed
                    .chunk()
                    .await
                    .expect("the stream")
                    .expect("the answer");
                read.push_str(std::str::from_utf8(&chunk).unwrap());
                let answer = read
                    .lines()
                    .filter_map(|line| line.strip_prefix("data:"))
                    .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
                    .find(|message| message["id"] == json!(2));
                if let Some(answer) = answer {
                    return answer;
                }
            }
        })
        .await
        .expect("the answer on the resumed stream")
    };
    for _ in 0..2 {
        let answer = answer_on(wire.pick_up_as(&last_event, None).await).await;
        assert_eq!(
            answer["result"]["content"][0]["text"],
            json!("slept 1500 ms"),
            "{answer}"
        );
        assert_ne!(answer["result"]["isError"], json!(true), "{answer}");
    }
    let _ = terminate(tether).await;
}

/// A 2025-11-25 agent on Streamable HTTP that declared nothing a server may ask it has its tool
/// calls served past rmcp's session machinery (`gateway/http/calls.rs`), with all rmcp would
/// give them: a priming event naming where to pick the stream up, the call's progress on its
/// own stream before the answer, and a cancellation that reaches the server and ends the
/// stream unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_agents_tool_calls_are_served_past_rmcp_with_all_it_gives() {
    let (dir, state, config) = one_upstream();
    let (tether, url) = serve_http(dir.path(), &config).await;
    let (wire, slow) = Wire::session_with(&url, "slow").await;

    let (_, body) = wire
        .post_text(
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": slow, "arguments": {"ms": 400}, "_meta": {"progressToken": "p"}}}),
        )
        .await;
    let ids = event_ids(&body);
    assert!(
        ids.first().is_some_and(|id| id.starts_with('t')),
        "the stream is Tether's own: {body}"
    );
    let messages: Vec<Value> = body
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str(data.trim()).ok())
        .collect();
    let answer_at = messages
        .iter()
        .position(|m| m["id"] == 2)
        .expect("the answer");
    assert_eq!(
        answer_at,
        messages.len() - 1,
        "the answer comes last: {body}"
    );
    assert!(answer_at >= 1, "progress before the answer: {body}");
    assert!(messages[..answer_at].iter().all(|m| m["method"] == "notifications/progress"
        && m["params"]["progressToken"] == "p"));
    // Picked up again after the answer went out: the progress again, and the answer again (a
    // small result is kept, as rmcp keeps its answers; a large one's bytes are not).
    let again = wire.pick_up(ids[0]).await;
    let again = body_in_time(again).await;
    assert!(again.contains("notifications/progress"), "{again}");
    let answer_line = body
        .lines()
        .find(|line| {
            line.strip_prefix("data:")
                .and_then(|data| serde_json::from_str::<Value>(data.trim()).ok())
                .is_some_and(|message| message["id"] == 2)
        })
        .expect("the answer's line");
    assert!(again.contains(answer_line), "{again}");

    // Cancelled while it runs: the server hears of it, and the POST's stream ends unanswered;
    // the same with a cancellation whose POST does not say its length (sent in chunks).
    for (id, in_chunks) in [(3, false), (8, true)] {
        let (calls, cancelled) = (state.calls_of("slow"), state.cancelled());
        let (running, priming) = wire.sleep_on(&slow, id, 20000).await;
        assert!(priming.contains("id: t"), "{priming:?}");
        wait_until("the slow call reached the server", || {
            state.calls_of("slow") > calls
        })
        .await;
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "changed my mind"}});
        let sent = match in_chunks {
            true => wire.open_in_chunks(cancel).await,
            false => wire.open(cancel).await,
        };
        assert!(sent.status().is_success(), "{}", sent.status());
        wait_until("the server heard of the cancellation", || {
            state.cancelled() > cancelled
        })
        .await;
        let rest = body_in_time(running).await;
        assert!(
            !rest.contains(&format!("\"id\":{id}")),
            "a cancelled call is not answered: {rest}"
        );
    }

    // A call whose POST comes in chunks (no length said) is served here too.
    let chunked = wire
        .open_in_chunks(json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": {"name": slow, "arguments": {"ms": 10}}}))
        .await;
    let body = body_in_time(chunked).await;
    assert!(
        event_ids(&body)
            .first()
            .is_some_and(|id| id.starts_with('t')),
        "the stream is Tether's own: {body}"
    );
    assert!(
        body.contains("slept 10 ms") && body.contains("\"id\":9"),
        "{body}"
    );

    // Picked up while its POST is still open: the new reader takes the stream over, as in
    // rmcp, and gets the answer; the POST's stream ends without it.
    let (first, priming) = wire.sleep_on(&slow, 5, 800).await;
    let priming_id = event_ids(&priming)[0].to_string();
    let taken_over = wire.pick_up(&priming_id).await;
    let (taken_over, left) = tokio::join!(body_in_time(taken_over), body_in_time(first));
    assert!(
        taken_over.contains("slept 800 ms"),
        "the new reader: {taken_over}"
    );
    assert!(!left.contains("\"id\":5"), "the old reader: {left}");

    // A request rmcp refuses is refused as before, and its call never runs.
    let echoes = state.calls_of("echo");
    let echo = wire.tool_ending("echo").await;
    let call = json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
        "params": {"name": echo, "arguments": {"text": "refused"}}});
    for (headers, refusal) in [
        (vec![("origin", "http://evil.example")], Some(403)),
        (vec![("host", "evil.example")], Some(403)),
        (vec![("accept", "application/json")], None),
    ] {
        let response = wire.open_with(call.clone(), &headers).await;
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        assert!(!status.is_success(), "{headers:?}: {status} {body}");
        if let Some(refusal) = refusal {
            assert_eq!(status.as_u16(), refusal, "{headers:?}: {body}");
        }
    }
    assert_eq!(state.calls_of("echo"), echoes, "no refused call ran");
    // Another protocol version than the session's: rmcp's to judge (it serves this one).
    let other = wire
        .open_with(call.clone(), &[("mcp-protocol-version", "2025-06-18")])
        .await;
    let body = other.text().await.unwrap_or_default();
    assert!(
        event_ids(&body).iter().all(|id| !id.starts_with('t')),
        "{body}"
    );
    // An unknown stream picked up: an empty stream, not "no such session".
    let unknown = wire.pick_up("t999999/0").await;
    assert!(unknown.text().await.unwrap().is_empty());

    assert!(terminate(tether).await.success());
}

/// A 2025-11-25 agent on Streamable HTTP that declared sampling has its tool calls served past
/// rmcp too: what the server asks during the call comes on the call's own stream (where rmcp
/// puts a request that belongs to a client's request), the agent's answer POSTed to the session
/// is taken as rmcp takes one (202) and reaches the server, whose result ends the stream, also
/// when it comes in chunks without a protocol version header (as rmcp takes it); an error the
/// agent answers with reaches the server as its error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_request_during_an_http_agents_call_rides_the_calls_own_stream() {
    let (dir, config) = hostile_config("sampling");
    let (tether, url) = serve_http(dir.path(), &config).await;
    let mut wire = Wire::new(&url, false);
    wire.capabilities = json!({"sampling": {}});
    wire.initialize().await;
    let big = wire.tool_ending("big").await;
    let sampled = json!({"result": {"role": "assistant", "model": "m",
        "content": {"type": "text", "text": "from the agent"}}});
    let refused = json!({"error": {"code": -32000, "message": "the user said no"}});
    let chunked = json!({"result": {"role": "assistant", "model": "m",
        "content": {"type": "text", "text": "in chunks"}}});
    for (id, mut reply, expected, plain) in [
        (4, sampled, "from the agent", true),
        (5, refused, "sampling refused: the user said no", true),
        // No protocol version header (rmcp reads 2025-03-26) and no length: taken too.
        (6, chunked, "in chunks", false),
    ] {
        let mut running = wire
            .open(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": big, "arguments": {}}}))
            .await;
        let mut seen = String::new();
        let asked = loop {
            seen.push_str(&Wire::first_chunk(&mut running).await);
            let messages = data_messages(&seen);
            if let Some(asked) = messages
                .into_iter()
                .find(|m| m["method"] == "sampling/createMessage")
            {
                break asked;
            }
        };
        let ids = event_ids(&seen);
        assert!(
            !ids.is_empty() && ids.iter().all(|id| id.starts_with('t')),
            "on the call's own stream: {seen}"
        );
        reply["jsonrpc"] = json!("2.0");
        reply["id"] = asked["id"].clone();
        let taken = if plain {
            wire.open(reply).await
        } else {
            let text = reply.to_string();
            let chunks = [text[..10].to_string(), text[10..].to_string()];
            let chunks = futures::stream::iter(chunks.map(Ok::<_, std::io::Error>));
            reqwest::Client::new()
                .post(&url)
                .header("accept", "application/json, text/event-stream")
                .header("content-type", "application/json")
                .header("mcp-session-id", wire.session.as_deref().unwrap())
                .body(reqwest::Body::wrap_stream(chunks))
                .send()
                .await
                .expect("the answer's POST")
        };
        assert_eq!(taken.status().as_u16(), 202, "the answer is taken");
        let rest = body_in_time(running).await;
        seen.push_str(&rest);
        let messages = data_messages(&seen);
        let answer = messages.iter().find(|m| m["id"] == id).expect("answered");
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        assert!(text.contains(expected), "{seen}");
    }
    assert!(terminate(tether).await.success());
}

/// The JSON-RPC messages of an event stream's `data` lines.
fn data_messages(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str(data.trim()).ok())
        .collect()
}

/// A 2026-07-28 agent on Streamable HTTP (no session) has its tool calls served past rmcp's
/// per-request service (`gateway/http/calls/modern.rs`), and gets what rmcp would give it: the
/// same events (no ids: such a stream cannot be picked up) and statuses as for the same POST
/// that rmcp serves (one with a loopback `Origin`, which this path leaves to rmcp); the log
/// messages a call asks for on its stream before its answer, here as from rmcp; a request whose
/// headers contradict its body refused, its call never run; and a call whose agent disconnects
/// cancelled at the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_agents_http_calls_get_from_tether_what_rmcp_gives() {
    let (dir, state, config) = one_upstream();
    let (tether, url) = serve_http(dir.path(), &config).await;
    let wire = Wire::new(&url, true);
    let (echo, slow) = (
        wire.tool_ending("echo").await,
        wire.tool_ending("slow").await,
    );
    let http = reqwest::Client::new();
    let post = |name: &str, body: Value, headers: &[(&str, &str)]| {
        let mut request = http
            .post(&url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", name)
            .json(&body);
        for (header, value) in headers {
            request = request.header(*header, *value);
        }
        request.send()
    };
    let call = |id: u64, name: &str, arguments: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": name, "arguments": arguments, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "progressToken": "p",
        }}})
    };
    let by_rmcp = [("origin", "http://localhost:1")];
    for (name, arguments) in [
        (echo.as_str(), json!({"text": "same"})),
        ("no-such-tool", json!({})),
    ] {
        let mut seen = Vec::new();
        for headers in [&[][..], &by_rmcp[..]] {
            let response = post(name, call(2, name, arguments.clone()), headers)
                .await
                .expect("an answer");
            let status = response.status();
            let media = response.headers()["content-type"].clone();
            let body = response.text().await.expect("the body");
            assert!(body.lines().all(|line| !line.starts_with("id:")), "{body}");
            let messages: Vec<Value> = body
                .lines()
                .filter_map(|line| line.strip_prefix("data: "))
                .chain(body.starts_with('{').then_some(body.as_str()))
                .map(|data| serde_json::from_str(data).expect("JSON"))
                .collect();
            seen.push((status, media, messages));
        }
        assert_eq!(seen[0], seen[1], "{name}: served here, then by rmcp");
        assert!(!seen[0].2.is_empty(), "{seen:?}");
    }
    assert_eq!(state.calls_of("echo"), 2);
    // Its progress before its answer, on its stream.
    let answer = post(&slow, call(3, &slow, json!({"ms": 300})), &[])
        .await
        .expect("an answer")
        .text()
        .await
        .expect("the body");
    let progress_at = answer.find("notifications/progress");
    let answer_at = answer.find("slept 300 ms");
    assert!(
        progress_at.is_some() && answer_at.is_some() && progress_at < answer_at,
        "{answer}"
    );

    // The log messages it asked for (`_meta` `logLevel`), on its stream before its answer,
    // served here as by rmcp; none below its level (the server logs at `warning`).
    let mut logged = Vec::new();
    for (id, headers, level) in [
        (6, &[][..], "warning"),
        (7, &by_rmcp[..], "warning"),
        (8, &[][..], "error"),
    ] {
        let mut asking = call(id, &slow, json!({"ms": 1500}));
        asking["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = json!(level);
        let calls = state.calls_of("slow");
        let running = tokio::spawn(post(&slow, asking, headers));
        wait_until("the call reached the server", || {
            state.calls_of("slow") > calls
        })
        .await;
        logged.push(format!("logged during call {id}"));
        state.control(json!({"logs": logged}));
        let body = running
            .await
            .unwrap()
            .expect("an answer")
            .text()
            .await
            .unwrap();
        let log_at = body.find(&format!("\"logged during call {id}\""));
        let answer_at = body.find("slept 1500 ms");
        assert!(answer_at.is_some(), "{body}");
        if level == "error" {
            assert!(
                !body.contains("notifications/message"),
                "below its level: {body}"
            );
            continue;
        }
        assert!(
            log_at.is_some() && log_at < answer_at,
            "{headers:?}: {body}"
        );
        assert!(body.contains("notifications/message"), "{body}");
    }

    // Headers that contradict the body: refused as rmcp refuses them, and the call never runs.
    let refused = post(&slow, call(4, &echo, json!({"text": "x"})), &[])
        .await
        .expect("an answer");
    assert_eq!(refused.status().as_u16(), 400);
    assert_eq!(state.calls_of("echo"), 2, "the refused call never ran");

    // The agent disconnects while its call runs: the server hears the call was cancelled.
    let cancelled = state.cancelled();
    let slow_calls = state.calls_of("slow");
    let left = tokio::spawn(post(&slow, call(5, &slow, json!({"ms": 20000})), &[]));
    wait_until("the slow call reached the server", || {
        state.calls_of("slow") > slow_calls
    })
    .await;
    left.abort();
    wait_until("the server heard of the cancellation", || {
        state.cancelled() > cancelled
    })
    .await;
    assert!(terminate(tether).await.success());
}

/// A 2026-07-28 agent on stdio whose call an older server asks something during: the agent gets
/// the question as a request for input, calls again with its answer, and the server's result —
/// which arrives for the first request's call — reaches the request that resumed it, as does
/// the progress the server reports after the answer (before it, the first request's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_resumed_with_answers_on_stdio_gets_the_servers_result() {
    use rmcp::ClientServiceExt;
    use rmcp::model::{
        CallToolRequest, ClientCapabilities, ClientInfo, ClientRequest, ProgressNotificationParam,
        ProgressToken, ProtocolVersion, ServerResult,
    };
    use rmcp::service::PeerRequestOptions;

    /// Answers sampling; keeps the progress it hears, by token.
    #[derive(Clone, Default)]
    struct Sampler(Arc<Mutex<Vec<(ProgressToken, f64)>>>);
    impl ClientHandler for Sampler {
        fn get_info(&self) -> ClientInfo {
            let mut info = ClientInfo::default();
            info.capabilities = ClientCapabilities::builder().enable_sampling().build();
            info
        }

        async fn on_progress(
            &self,
            params: ProgressNotificationParam,
            _context: NotificationContext<RoleClient>,
        ) {
            let heard = (params.progress_token, params.progress);
            self.0.lock().unwrap().push(heard);
        }
    }

    let (dir, config) = hostile_config("sampling");
    let mut tether = serve(dir.path(), &config, &[], None);
    drain_stderr(&mut tether);
    let io = (tether.stdout.take().unwrap(), tether.stdin.take().unwrap());
    let lifecycle = rmcp::ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    let sampler = Sampler::default();
    let client = sampler
        .clone()
        .serve_with_lifecycle(io, lifecycle)
        .await
        .expect("an MCP session on stdio");
    let big = big_tool(client.peer()).await;
    // Sent with a progress token, as every call below.
    let send = |params: CallToolRequestParams| {
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        client
            .peer()
            .send_request_with_option(request, PeerRequestOptions::no_options())
    };
    let first = send(CallToolRequestParams::new(big.clone()))
        .await
        .expect("the call");
    let first_token = first.progress_token.clone();
    let asked = first.await_response().await.expect("the call's answer");
    let ServerResult::InputRequiredResult(asked) = asked else {
        panic!("the server's question comes as a request for input: {asked:?}")
    };
    let key = (asked.input_requests.as_ref())
        .and_then(|requests| requests.keys().next().cloned())
        .expect("a question");
    let mut retry = CallToolRequestParams::new(big);
    let answer = json!({"role": "assistant", "model": "m",
                        "content": {"type": "text", "text": "from the agent"}});
    retry.input_responses = Some([(key, answer)].into());
    retry.request_state = asked.request_state;
    let retried = send(retry).await.expect("the retry");
    let retry_token = retried.progress_token.clone();
    let answered = retried.await_response().await.expect("the retry's answer");
    let ServerResult::CallToolResult(answered) = answered else {
        panic!("the retry ends with the server's result: {answered:?}")
    };
    assert!(
        text(&answered).starts_with("sampling answered:")
            && text(&answered).contains("from the agent"),
        "{answered:?}"
    );
    // Progress comes before its request's answer on the wire; the client hears it on a task
    // of its own.
    wait_until("the progress after the answer reached the retry", || {
        sampler
            .0
            .lock()
            .unwrap()
            .contains(&(retry_token.clone(), 2.0))
    })
    .await;
    let heard = sampler.0.lock().unwrap().clone();
    assert!(
        !heard.contains(&(first_token, 2.0)) && heard.len() <= 2,
        "each update went to the request the call was running for: {heard:?}"
    );
    drop(client);
    let _ = terminate(tether).await;
}

/// Keeps reading a child's stderr so it never blocks on a full pipe.
fn drain_stderr(child: &mut Child) {
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(_)) = lines.next_line().await {}
        });
    }
}
