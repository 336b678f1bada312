//! Smoke test of the `mcp-fixture` binary over its three transports, with raw clients (no
//! rmcp client), plus the fault modes the supervision tests rely on.

use std::{path::Path, pin::Pin, process::Stdio as Piped, time::Duration};

use futures::{Stream, StreamExt};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    process::{Child, ChildStdin, ChildStdout, Command},
};

const FIXTURE: &str = env!("CARGO_BIN_EXE_mcp-fixture");
/// Generous: CI has two cores and may be compiling at the same time.
const WAIT: Duration = Duration::from_secs(20);
const PROTOCOL: &str = "2025-06-18";

fn initialize_params() -> Value {
    json!({
        "protocolVersion": PROTOCOL,
        "capabilities": {},
        "clientInfo": {"name": "fixture-smoke", "version": "0"},
    })
}

fn read_counter(dir: &Path, name: &str) -> u64 {
    std::fs::read_to_string(dir.join(name))
        .map(|text| text.trim().parse().expect("counter is an integer"))
        .unwrap_or(0)
}

fn calls_log(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("calls.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Replaces control.json atomically, as tests should (the fixture polls it).
fn write_control(dir: &Path, control: Value) {
    let tmp = dir.join("control.json.tmp");
    std::fs::write(&tmp, control.to_string()).unwrap();
    std::fs::rename(tmp, dir.join("control.json")).unwrap();
}

fn tool_names(list: &Value) -> Vec<String> {
    list["result"]["tools"]
        .as_array()
        .expect("tools/list result has tools")
        .iter()
        .map(|tool| tool["name"].as_str().unwrap().to_owned())
        .collect()
}

fn text_of(response: &Value) -> &str {
    response["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {response}"))
}

async fn wait_exit(child: &mut Child) -> i32 {
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("fixture exits in time")
        .unwrap();
    status
        .code()
        .unwrap_or_else(|| panic!("fixture killed by a signal: {status}"))
}

// ---------------------------------------------------------------------------------------
// stdio

struct StdioFixture {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    next_id: u64,
    notifications: Vec<Value>,
}

impl StdioFixture {
    fn spawn(dir: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(FIXTURE)
            .args(["--transport", "stdio", "--state-dir"])
            .arg(dir)
            .args(args)
            .stdin(Piped::piped())
            .stdout(Piped::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn mcp-fixture");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            child,
            stdin,
            stdout,
            next_id: 0,
            notifications: Vec::new(),
        }
    }

    async fn send(&mut self, message: Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
    }

    /// The next message from the fixture, or None at end of output.
    async fn receive(&mut self) -> Option<Value> {
        let line = tokio::time::timeout(WAIT, self.stdout.next_line())
            .await
            .expect("fixture answers in time")
            .unwrap()?;
        Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
    }

    async fn notify(&mut self, method: &str) {
        self.send(json!({"jsonrpc": "2.0", "method": method})).await;
    }

    /// Sends a request; returns its response, or None if the output ended first.
    /// Notifications seen meanwhile are kept in `notifications`.
    async fn try_request(&mut self, method: &str, params: Value) -> Option<Value> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        loop {
            let message = self.receive().await?;
            if message.get("id") == Some(&json!(id)) {
                return Some(message);
            }
            self.notifications.push(message);
        }
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.try_request(method, params)
            .await
            .unwrap_or_else(|| panic!("no answer to {method}"))
    }

    async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await
    }

    async fn handshake(&mut self) -> Value {
        let init = self.request("initialize", initialize_params()).await;
        self.notify("notifications/initialized").await;
        init
    }

    async fn close_and_wait(&mut self) -> i32 {
        self.stdin = None;
        wait_exit(&mut self.child).await
    }
}

#[tokio::test]
async fn stdio_tools_control_and_progress() {
    let dir = tempfile::tempdir().unwrap();
    let mut fixture = StdioFixture::spawn(dir.path(), &[]);

    let init = fixture.handshake().await;
    assert_eq!(init["result"]["serverInfo"]["name"], "mcp-fixture");
    assert_eq!(init["result"]["protocolVersion"], PROTOCOL);
    assert_eq!(init["result"]["capabilities"]["tools"]["listChanged"], true);

    let list = fixture.request("tools/list", json!({})).await;
    assert_eq!(
        tool_names(&list),
        [
            "echo",
            "add",
            "side_effect",
            "slow",
            "hang",
            "exit_now",
            "fail"
        ]
    );
    for tool in list["result"]["tools"].as_array().unwrap() {
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
        let read_only = tool["annotations"]["readOnlyHint"].as_bool();
        assert_eq!(read_only == Some(true), tool["name"] == "add", "{tool}");
    }

    let echo = fixture.call("echo", json!({"text": "hello"})).await;
    assert_eq!(text_of(&echo), "hello");
    assert_eq!(
        fixture.call("add", json!({"a": 2, "b": 3})).await["result"]["content"][0]["text"],
        "5"
    );
    let fail = fixture.call("fail", json!({})).await;
    assert_eq!(fail["result"]["isError"], true);
    assert_eq!(text_of(&fail), "fail tool always fails");
    let unknown = fixture.call("nope", json!({})).await;
    assert!(unknown["error"]["code"].is_i64(), "{unknown}");
    assert_eq!(
        fixture.request("ping", json!({})).await["result"],
        json!({})
    );

    // Progress every 100 ms when the call carries a progress token.
    let slow = fixture
        .request(
            "tools/call",
            json!({"name": "slow", "arguments": {"ms": 350}, "_meta": {"progressToken": "p1"}}),
        )
        .await;
    assert_eq!(text_of(&slow), "slept 350 ms");
    let progress: Vec<&Value> = fixture
        .notifications
        .iter()
        .filter(|n| n["method"] == "notifications/progress")
        .collect();
    assert!(progress.len() >= 2, "progress: {progress:?}");
    assert!(
        progress
            .iter()
            .all(|n| n["params"]["progressToken"] == "p1")
    );

    // Changing the tool set at run time announces it and changes tools/list.
    write_control(dir.path(), json!({"tools": ["echo"]}));
    let changed = loop {
        let message = fixture.receive().await.expect("list_changed notification");
        if message["method"] == "notifications/tools/list_changed" {
            break message;
        }
    };
    assert!(changed.get("id").is_none());
    assert_eq!(
        tool_names(&fixture.request("tools/list", json!({})).await),
        ["echo"]
    );
    let hidden = fixture.call("add", json!({"a": 1, "b": 1})).await;
    assert!(hidden.get("error").is_some(), "{hidden}");

    assert_eq!(fixture.close_and_wait().await, 0);
    assert_eq!(read_counter(dir.path(), "starts"), 1);
    assert_eq!(read_counter(dir.path(), "initializes"), 1);
    assert_eq!(
        calls_log(dir.path()),
        [
            r#"echo {"text":"hello"}"#,
            r#"add {"a":2,"b":3}"#,
            "fail {}",
            r#"slow {"ms":350}"#,
        ]
    );
    let pid = std::fs::read_to_string(dir.path().join("pid")).unwrap();
    assert!(pid.trim().parse::<u32>().is_ok());
}

#[tokio::test]
async fn stdio_crashes_count_across_respawns() {
    let dir = tempfile::tempdir().unwrap();

    // Exit during the 2nd call: logged, never answered.
    let mut fixture = StdioFixture::spawn(dir.path(), &["--crash-after-calls", "2"]);
    fixture.handshake().await;
    fixture.call("side_effect", json!({"label": "one"})).await;
    assert!(
        fixture
            .try_request(
                "tools/call",
                json!({"name": "side_effect", "arguments": {"label": "two"}})
            )
            .await
            .is_none()
    );
    assert_eq!(wait_exit(&mut fixture.child).await, 4);
    assert_eq!(
        calls_log(dir.path()),
        [
            r#"side_effect {"label":"one"}"#,
            r#"side_effect {"label":"two"}"#
        ]
    );

    // Answer the 1st call, then exit.
    let mut fixture = StdioFixture::spawn(dir.path(), &["--crash-after-answers", "1"]);
    fixture.handshake().await;
    assert_eq!(
        text_of(&fixture.call("echo", json!({"text": "last"})).await),
        "last"
    );
    assert_eq!(wait_exit(&mut fixture.child).await, 4);

    // The tool that kills the process mid-call.
    let mut fixture = StdioFixture::spawn(dir.path(), &[]);
    fixture.handshake().await;
    assert!(
        fixture
            .try_request(
                "tools/call",
                json!({"name": "exit_now", "arguments": {"code": 42}})
            )
            .await
            .is_none()
    );
    assert_eq!(wait_exit(&mut fixture.child).await, 42);

    assert_eq!(read_counter(dir.path(), "starts"), 3);
    assert_eq!(read_counter(dir.path(), "initializes"), 3);
    assert_eq!(calls_log(dir.path()).len(), 4);
}

#[tokio::test]
async fn stdio_handshake_faults() {
    let dir = tempfile::tempdir().unwrap();

    let mut fixture = StdioFixture::spawn(dir.path(), &["--crash-at-startup"]);
    assert_eq!(wait_exit(&mut fixture.child).await, 3);
    let mut fixture = StdioFixture::spawn(dir.path(), &["--crash-at-startup", "9"]);
    assert_eq!(wait_exit(&mut fixture.child).await, 9);

    // The first initialize (counted across restarts) kills the process; the next succeeds.
    let mut fixture = StdioFixture::spawn(dir.path(), &["--fail-initializes", "1"]);
    assert!(
        fixture
            .try_request("initialize", initialize_params())
            .await
            .is_none()
    );
    assert_eq!(wait_exit(&mut fixture.child).await, 6);
    let mut fixture = StdioFixture::spawn(
        dir.path(),
        &["--fail-initializes", "1", "--ping-unsupported"],
    );
    assert!(fixture.handshake().await.get("result").is_some());
    let ping = fixture.request("ping", json!({})).await;
    assert_eq!(ping["error"]["code"], -32601, "{ping}");
    assert_eq!(fixture.close_and_wait().await, 0);

    // Flap: the handshake succeeds, then the process dies.
    let mut fixture = StdioFixture::spawn(dir.path(), &["--flap"]);
    assert!(fixture.handshake().await.get("result").is_some());
    assert_eq!(wait_exit(&mut fixture.child).await, 7);

    let mut fixture = StdioFixture::spawn(dir.path(), &["--crash-after-ms", "300"]);
    fixture.handshake().await;
    assert_eq!(wait_exit(&mut fixture.child).await, 5);

    assert_eq!(read_counter(dir.path(), "starts"), 6);
    assert_eq!(read_counter(dir.path(), "initializes"), 4);
}

// ---------------------------------------------------------------------------------------
// HTTP (Streamable HTTP and legacy SSE)

struct HttpFixture {
    child: Child,
    base: String,
    http: reqwest::Client,
}

impl HttpFixture {
    async fn spawn(transport: &str, dir: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(FIXTURE)
            .args([
                "--transport",
                transport,
                "--bind",
                "127.0.0.1:0",
                "--state-dir",
            ])
            .arg(dir)
            .args(args)
            .stdin(Piped::null())
            .stdout(Piped::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn mcp-fixture");
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(WAIT, stdout.next_line())
            .await
            .expect("fixture announces its address")
            .unwrap()
            .expect("a first line");
        let address = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("first line: {line}"));
        Self {
            child,
            base: format!("http://{address}"),
            http: reqwest::Client::new(),
        }
    }
}

/// Reads `event`/`data` pairs from a `text/event-stream` body.
struct EventStream {
    body: Pin<Box<dyn Stream<Item = reqwest::Result<Vec<u8>>> + Send>>,
    buffer: String,
}

impl EventStream {
    fn new(response: reqwest::Response) -> Self {
        Self {
            body: Box::pin(
                response
                    .bytes_stream()
                    .map(|chunk| chunk.map(|bytes| bytes.to_vec())),
            ),
            buffer: String::new(),
        }
    }

    /// The next event with data, as (event name, data); None when the stream ends.
    async fn next(&mut self) -> Option<(String, String)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut event = "message".to_owned();
                let mut data = Vec::new();
                for line in block.lines() {
                    if let Some(value) = line.strip_prefix("event:") {
                        event = value.trim().to_owned();
                    } else if let Some(value) = line.strip_prefix("data:") {
                        data.push(value.strip_prefix(' ').unwrap_or(value));
                    }
                }
                if !data.is_empty() && !data.concat().is_empty() {
                    return Some((event, data.join("\n")));
                }
                continue;
            }
            let chunk = tokio::time::timeout(WAIT, self.body.next())
                .await
                .expect("event in time")?
                .expect("stream chunk");
            self.buffer
                .push_str(&String::from_utf8_lossy(&chunk).replace("\r\n", "\n"));
        }
    }

    /// The next `message` event's JSON.
    async fn next_message(&mut self) -> Value {
        loop {
            let (event, data) = self.next().await.expect("a message event");
            if event == "message" {
                return serde_json::from_str(&data).unwrap();
            }
        }
    }
}

struct Reply {
    status: reqwest::StatusCode,
    session: Option<String>,
    /// The JSON-RPC answer (from a JSON body or the response's event stream), if any.
    body: Option<Value>,
}

/// A Streamable HTTP POST to `/mcp`.
async fn post_mcp(fixture: &HttpFixture, session: Option<&str>, message: Value) -> Reply {
    let mut request = fixture
        .http
        .post(format!("{}/mcp", fixture.base))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(message.to_string());
    if let Some(session) = session {
        request = request
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", PROTOCOL);
    }
    let response = tokio::time::timeout(WAIT, request.send())
        .await
        .expect("HTTP answer in time")
        .unwrap();
    let status = response.status();
    let session = response
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = if content_type.starts_with("text/event-stream") {
        let mut events = EventStream::new(response);
        loop {
            match events.next().await {
                None => break None,
                Some((_, data)) => {
                    let value: Value = serde_json::from_str(&data).unwrap();
                    if value.get("id").is_some() {
                        break Some(value);
                    }
                }
            }
        }
    } else {
        let text = response.text().await.unwrap();
        serde_json::from_str(&text).ok()
    };
    Reply {
        status,
        session,
        body,
    }
}

fn rpc(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

fn initialized() -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
}

#[tokio::test]
async fn streamable_http_serves_and_injects_http_faults() {
    let dir = tempfile::tempdir().unwrap();
    let mut fixture = HttpFixture::spawn("http", dir.path(), &["--fail-initializes", "1"]).await;

    // First initialize fails with HTTP 500, the next one succeeds.
    let failed = post_mcp(&fixture, None, rpc(1, "initialize", initialize_params())).await;
    assert_eq!(failed.status, 500);
    let init = post_mcp(&fixture, None, rpc(1, "initialize", initialize_params())).await;
    assert_eq!(init.status, 200);
    assert_eq!(
        init.body.unwrap()["result"]["serverInfo"]["name"],
        "mcp-fixture"
    );
    let session = init.session.expect("a session id");
    let ack = post_mcp(&fixture, Some(&session), initialized()).await;
    assert_eq!(ack.status, 202);

    let list = post_mcp(&fixture, Some(&session), rpc(2, "tools/list", json!({}))).await;
    assert!(tool_names(&list.body.unwrap()).contains(&"echo".to_owned()));
    let echo = post_mcp(
        &fixture,
        Some(&session),
        rpc(
            3,
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "over http"}}),
        ),
    )
    .await;
    assert_eq!(text_of(&echo.body.unwrap()), "over http");

    // Tool-list changes reach the session's standalone GET stream.
    let standalone = fixture
        .http
        .get(format!("{}/mcp", fixture.base))
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", PROTOCOL)
        .send()
        .await
        .unwrap();
    assert_eq!(standalone.status(), 200);
    let mut events = EventStream::new(standalone);
    write_control(dir.path(), json!({"tools": ["echo", "slow"]}));
    assert_eq!(
        events.next_message().await["method"],
        "notifications/tools/list_changed"
    );

    // Unknown session: 404 by default ...
    let stale = post_mcp(
        &fixture,
        Some("no-such-session"),
        rpc(4, "tools/list", json!({})),
    )
    .await;
    assert_eq!(stale.status, 404);
    // ... or 400 with an id-less JSON-RPC error, switched at run time.
    write_control(
        dir.path(),
        json!({"tools": ["echo", "slow"], "http_unknown_session": 400}),
    );
    let stale = post_mcp(
        &fixture,
        Some("no-such-session"),
        rpc(5, "tools/list", json!({})),
    )
    .await;
    assert_eq!(stale.status, 400);
    let body = stale.body.expect("a JSON body");
    assert_eq!(body["id"], Value::Null);
    assert_eq!(body["error"]["code"], -32000);
    // A known session is unaffected.
    let list = post_mcp(&fixture, Some(&session), rpc(6, "tools/list", json!({}))).await;
    assert_eq!(list.status, 200);

    assert_eq!(read_counter(dir.path(), "initializes"), 2);
    assert_eq!(calls_log(dir.path()), [r#"echo {"text":"over http"}"#]);
    fixture.child.kill().await.unwrap();
}

#[tokio::test]
async fn legacy_sse_serves_and_announces_tool_changes() {
    let dir = tempfile::tempdir().unwrap();
    let mut fixture = HttpFixture::spawn("sse", dir.path(), &["--crash-after-answers", "2"]).await;

    let stream = fixture
        .http
        .get(format!("{}/sse", fixture.base))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let mut events = EventStream::new(stream);
    let (event, endpoint) = events.next().await.expect("endpoint event");
    assert_eq!(event, "endpoint");
    assert!(endpoint.starts_with("/messages?sessionId="), "{endpoint}");
    let post = |message: Value| {
        let request = fixture
            .http
            .post(format!("{}{endpoint}", fixture.base))
            .header("content-type", "application/json")
            .body(message.to_string());
        async move { request.send().await.unwrap().status() }
    };

    assert_eq!(post(rpc(1, "initialize", initialize_params())).await, 202);
    let init = events.next_message().await;
    assert_eq!(init["id"], 1);
    assert_eq!(init["result"]["serverInfo"]["name"], "mcp-fixture");
    assert_eq!(post(initialized()).await, 202);

    assert_eq!(
        post(rpc(
            2,
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "over sse"}})
        ))
        .await,
        202
    );
    let echo = events.next_message().await;
    assert_eq!(echo["id"], 2);
    assert_eq!(text_of(&echo), "over sse");

    write_control(dir.path(), json!({"tools": ["echo", "add"]}));
    let changed = events.next_message().await;
    assert_eq!(changed["method"], "notifications/tools/list_changed");

    let unknown = fixture
        .http
        .post(format!("{}/messages?sessionId=nope", fixture.base))
        .header("content-type", "application/json")
        .body(rpc(9, "ping", json!({})).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);

    // The 2nd answer is delivered, then the process exits.
    assert_eq!(
        post(rpc(
            3,
            "tools/call",
            json!({"name": "add", "arguments": {"a": 1, "b": 2}})
        ))
        .await,
        202
    );
    let sum = events.next_message().await;
    assert_eq!(text_of(&sum), "3");
    assert_eq!(wait_exit(&mut fixture.child).await, 4);
    assert_eq!(calls_log(dir.path()).len(), 2);
}
