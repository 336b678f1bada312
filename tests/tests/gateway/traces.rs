//! Traces: `tether serve --otlp-endpoint` exports a span per forwarded `tools/call` to a real
//! OTLP/HTTP receiver (tests/python/otlp_receiver.py, on the OpenTelemetry project's own
//! protocol package), a child of the agent's span when its request carries a `traceparent` in
//! `_meta`, and the parent of the request the upstream server gets. Without an endpoint, the
//! agent's trace context reaches the server as it was sent.

use std::sync::Mutex as StdMutex;

use rmcp::model::RequestMetaObject;

use super::*;

/// The receiver's spans, as it prints them (one JSON object per line).
struct Receiver {
    /// Killed when dropped.
    _child: Child,
    port: u16,
    spans: Arc<StdMutex<Vec<serde_json::Value>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        let venv = python_venv("otlp", "opentelemetry-proto", "constraints-otlp.txt");
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("python")
            .join("otlp_receiver.py");
        let mut child = Command::new(venv.join("bin").join("python"))
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the OTLP receiver starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .expect("the receiver announces its port")
            .unwrap()
            .unwrap_or_default();
        let port = first
            .strip_prefix("listening on ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"));
        let spans = Arc::new(StdMutex::new(Vec::new()));
        let seen = spans.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(span) = serde_json::from_str(&line) {
                    seen.lock().unwrap().push(span);
                }
            }
        });
        Receiver {
            _child: child,
            port,
            spans,
        }
    }

    /// The span named `name`, once it has arrived.
    async fn span(&self, name: &str) -> serde_json::Value {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(span) = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .find(|s| s["name"] == name)
            {
                return span.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no span {name:?} arrived: {:#?}",
                self.spans.lock().unwrap()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// Calls `tool` with `traceparent` (if any) in the request's `_meta`.
async fn call_traced(
    client: &RunningService<RoleClient, Agent>,
    tool: &str,
    arguments: serde_json::Value,
    traceparent: Option<&str>,
) -> CallToolResult {
    let mut params = CallToolRequestParams::new(tool.to_string());
    if let Some(arguments) = args(arguments) {
        params = params.with_arguments(arguments);
    }
    if let Some(traceparent) = traceparent {
        let mut meta = RequestMetaObject::new();
        meta.set_traceparent(traceparent);
        params.meta = Some(meta);
    }
    client
        .peer()
        .call_tool(params)
        .await
        .expect("the gateway answers")
}

/// `tether serve` on stdio in front of one fixture `up`, with `extra` arguments.
async fn gateway(
    dir: &Path,
    config: &Path,
    extra: &[&str],
) -> (Child, RunningService<RoleClient, Agent>) {
    let mut command = serve_command(dir, config, extra);
    for variable in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_EXPORTER",
    ] {
        command.env_remove(variable);
    }
    // Spans are sent a tenth of a second after they end, not five seconds.
    command.env("OTEL_BSP_SCHEDULE_DELAY", "100");
    command.stderr(Stdio::from(
        std::fs::File::create(dir.join("stderr")).unwrap(),
    ));
    let mut tether = command.spawn().expect("tether serve starts");
    let io = (tether.stdout.take().unwrap(), tether.stdin.take().unwrap());
    let client = Agent::default()
        .serve(io)
        .await
        .expect("the agent's handshake with tether");
    wait_for_tools(&client, "the upstream's tools are listed", |t| {
        t.contains(&"up__echo".to_string())
    })
    .await;
    (tether, client)
}

fn traceparents(state: &StateDir) -> Vec<String> {
    std::fs::read_to_string(state.0.join("traceparents.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

const AGENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const AGENT_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_forwarded_call_is_a_span_between_the_agents_and_the_servers() {
    let receiver = Receiver::start().await;
    let (dir, state, config) = one_upstream();
    let endpoint = format!("http://127.0.0.1:{}", receiver.port);
    let (tether, client) = gateway(dir.path(), &config, &["--otlp-endpoint", &endpoint]).await;

    let traceparent = format!("00-{AGENT_TRACE}-{AGENT_SPAN}-01");
    let echoed = call_traced(
        &client,
        "up__echo",
        json!({"text": "traced"}),
        Some(&traceparent),
    );
    assert_eq!(text(&echoed.await), "traced");
    let failed = call_traced(&client, "up__fail", json!({}), None).await;
    assert!(is_error(&failed));

    let span = receiver.span("tools/call up__echo").await;
    assert_eq!(span["service"], "tether", "{span:#}");
    assert_eq!(span["content_type"], "application/x-protobuf");
    assert_eq!(
        span["trace_id"], AGENT_TRACE,
        "a child of the agent's span: {span:#}"
    );
    assert_eq!(span["parent_span_id"], AGENT_SPAN, "{span:#}");
    let attributes = &span["attributes"];
    for (key, expected) in [
        ("mcp.method.name", json!("tools/call")),
        ("gen_ai.tool.name", json!("up__echo")),
        ("tether.server", json!("up")),
        ("tether.tool.original", json!("echo")),
        ("tether.admission", json!("allow")),
        ("tether.attempts", json!(1)),
        ("tether.outcome", json!("ok")),
    ] {
        assert_eq!(attributes[key], expected, "{key}: {span:#}");
    }
    let failure = receiver.span("tools/call up__fail").await;
    assert_eq!(
        failure["attributes"]["tether.outcome"], "tool_error",
        "{failure:#}"
    );
    assert_eq!(failure["status"], 2, "an error status: {failure:#}");
    assert_eq!(
        failure["parent_span_id"], "",
        "a trace of its own: {failure:#}"
    );
    assert_ne!(failure["trace_id"], AGENT_TRACE);

    // Each upstream request is the child of its call's span: the first in the agent's trace.
    let parent = |span: &serde_json::Value| {
        format!(
            "00-{}-{}-01",
            span["trace_id"].as_str().unwrap(),
            span["span_id"].as_str().unwrap()
        )
    };
    assert_eq!(
        traceparents(&state),
        [parent(&span), parent(&failure)],
        "what the server got"
    );

    drop(client);
    assert!(terminate(tether).await.success());
    drop(receiver);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_exporter_the_agents_trace_context_reaches_the_server_as_sent() {
    let (dir, state, config) = one_upstream();
    let (tether, client) = gateway(dir.path(), &config, &[]).await;
    let traceparent = format!("00-{AGENT_TRACE}-{AGENT_SPAN}-01");
    let echoed = call_traced(
        &client,
        "up__echo",
        json!({"text": "plain"}),
        Some(&traceparent),
    )
    .await;
    assert_eq!(text(&echoed), "plain");
    assert_eq!(traceparents(&state), [traceparent]);
    drop(client);
    assert!(terminate(tether).await.success());
}
