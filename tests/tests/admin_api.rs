//! The admin API and the CLI on top of it, against a real supervisor with fixture servers.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use futures::{FutureExt, StreamExt};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tether::admin::server::ReloadFn;
use tether::admin::{AdminContext, AdminServer};
use tether::calls::CallResultKind;
use tether::config::ServerSpec;
use tether::metrics::Metrics;
use tether::policy::ServerState;
use tether_cli::state_file;
use tokio::io::{AsyncBufReadExt, BufReader};

pub(crate) const TOKEN: &str = "admin-test-token-5f0c";

/// What `POST /reload` will find in "the config file": servers, or a real config file that
/// does not load.
type Config = Arc<Mutex<Result<Vec<ServerSpec>, std::path::PathBuf>>>;

/// A config file that does not load (`text` written as `name` in a directory of its own, which
/// goes with the returned guard).
fn bad_config_file(name: &str, text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// A supervisor with the admin API in front of it, and an HTTP client for it.
pub(crate) struct Admin {
    pub(crate) host: Host,
    pub(crate) server: AdminServer,
    http: reqwest::Client,
    metrics: Arc<Metrics>,
    config: Config,
}

fn context(host: &Host, metrics: Arc<Metrics>, config: Config) -> AdminContext {
    let supervisor = host.supervisor.clone();
    let reload: ReloadFn = Arc::new(move || {
        let supervisor = supervisor.clone();
        let config = config.clone();
        async move {
            let specs = config.lock().unwrap().clone();
            let specs = match specs {
                Ok(specs) => specs,
                Err(file) => Err(tether::config::file::load(&file)
                    .expect_err("the bad config file does not load"))?,
            };
            Ok(supervisor.reload(specs).await)
        }
        .boxed()
    });
    AdminContext {
        supervisor: host.supervisor.clone(),
        reload,
        metrics,
        history: tether::admin::history::History::record(&host.supervisor),
    }
}

impl Admin {
    pub(crate) async fn start(host: Host) -> Admin {
        let metrics = Arc::new(Metrics::new());
        let config: Config = Arc::new(Mutex::new(Ok(Vec::new())));
        let ctx = context(&host, metrics.clone(), config.clone());
        let server = tether::admin::start(
            "127.0.0.1:0".parse().unwrap(),
            false,
            Some(TOKEN.into()),
            ctx,
        )
        .await
        .expect("the admin API starts");
        Admin {
            host,
            server,
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            metrics,
            config,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.addr)
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, self.url(path)).bearer_auth(TOKEN)
    }

    /// Sends a request; answers the status and the JSON body.
    async fn call(&self, request: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let response = request.send().await.expect("the admin API answers");
        let status = response.status();
        let body = response.text().await.unwrap();
        let json = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {status} {body}"));
        (status, json)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(self.request(reqwest::Method::GET, path)).await
    }

    async fn status(&self) -> Value {
        let (code, status) = self.get("/status").await;
        assert_eq!(code, StatusCode::OK, "{status}");
        status
    }

    pub(crate) async fn stop(self) {
        self.server.shutdown().await;
        self.host.supervisor.shutdown().await;
    }
}

fn server_row<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["servers"]
        .as_array()
        .expect("servers is a list")
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no row for {name}: {status}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_or_with_a_wrong_token_are_refused_with_401() {
    let admin = Admin::start(Host::fast()).await;
    for (method, path) in [
        (reqwest::Method::GET, "/status"),
        (reqwest::Method::GET, "/metrics"),
        (reqwest::Method::GET, "/events"),
        (reqwest::Method::GET, "/history"),
        (reqwest::Method::POST, "/reconnect/anything"),
        (reqwest::Method::POST, "/reload"),
        (reqwest::Method::PUT, "/policy"),
        (reqwest::Method::GET, "/no-such-endpoint"),
    ] {
        let (code, body) = admin
            .call(admin.http.request(method.clone(), admin.url(path)))
            .await;
        assert_eq!(code, StatusCode::UNAUTHORIZED, "{method} {path}: {body}");
        assert!(body["error"].as_str().unwrap().contains("Bearer"), "{body}");
        let (code, body) = admin
            .call(
                admin
                    .http
                    .request(method.clone(), admin.url(path))
                    .bearer_auth("admin-test-token-5f0d"),
            )
            .await;
        assert_eq!(code, StatusCode::UNAUTHORIZED, "{method} {path}: {body}");
        assert_eq!(body["error"], "the admin token is wrong");
    }
    // Another scheme is no token; the scheme's case does not matter.
    let (code, _) = admin
        .call(
            admin
                .http
                .get(admin.url("/status"))
                .basic_auth("admin", Some(TOKEN)),
        )
        .await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    let (code, _) = admin
        .call(
            admin
                .http
                .get(admin.url("/status"))
                .header("authorization", format!("bearer {TOKEN}")),
        )
        .await;
    assert_eq!(code, StatusCode::OK);
    // With the token, unknown endpoints and methods are JSON errors too.
    let (code, body) = admin.get("/no-such-endpoint").await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("/no-such-endpoint")
    );
    let (code, body) = admin
        .call(admin.request(reqwest::Method::DELETE, "/status"))
        .await;
    assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED, "{body}");
    assert!(body["error"].is_string());
    admin.stop().await;
}

/// A page opened after the fact sees what happened before: `/history` has each state a server
/// went through, in order. The page itself needs no token (it holds no data) and may not be
/// framed or load anything from elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_has_what_happened_before_and_the_dashboard_page_holds_no_data() {
    let admin = Admin::start(Host::fast()).await;
    let state = admin.host.state_dir("alpha");
    admin
        .host
        .supervisor
        .add_server(stdio_fixture("alpha", &state, &[]))
        .unwrap();
    wait_until("alpha's tools are visible", || {
        !admin.host.tools("alpha").is_empty()
    })
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let states = loop {
        let (code, history) = admin.get("/history").await;
        assert_eq!(code, StatusCode::OK, "{history}");
        let states: Vec<String> = history
            .as_array()
            .expect("a list")
            .iter()
            .filter(|e| e["kind"] == "lifecycle" && e["server"] == "alpha")
            .map(|e| {
                assert!(e["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{e}");
                e["state"].as_str().unwrap().to_string()
            })
            .collect();
        if states.last().map(String::as_str) == Some("healthy")
            || tokio::time::Instant::now() > deadline
        {
            break states;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(states, ["connecting", "connected", "healthy"]);
    let (_, history) = admin.get("/history").await;
    assert!(
        history
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "tools" && e["server"] == "alpha"),
        "the tools' publication is in it: {history}"
    );

    let page = admin.http.get(admin.url("/ui")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let header = |name: &str| {
        page.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    assert!(header("content-type").starts_with("text/html"));
    let csp = header("content-security-policy");
    for rule in [
        "default-src 'none'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(rule), "{csp}");
    }
    let html = page.text().await.unwrap();
    assert!(html.contains("<title>Tether"), "{html}");
    assert!(!html.contains(TOKEN));
    admin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_servers_with_state_tools_and_the_policy() {
    // Parked servers stay parked (no self-probe during the test).
    let host = Host::start(PARKED_STAYS_PARKED);
    let admin = Admin::start(host).await;
    let state = admin.host.state_dir("alpha");
    admin
        .host
        .supervisor
        .add_server(stdio_fixture("alpha", &state, &[]))
        .unwrap();
    let mut ghost = ServerSpec::stdio("ghost", "/nonexistent/mcp-server", &[]);
    ghost.timeouts = test_timeouts();
    admin.host.supervisor.add_server(ghost).unwrap();
    wait_until("alpha's tools are visible", || {
        !admin.host.tools("alpha").is_empty()
    })
    .await;
    wait_until("ghost parks", || {
        admin.host.view("ghost").state == ServerState::Parked
    })
    .await;

    let status = admin.status().await;
    let policy = &status["policy"];
    assert_eq!(policy["label"], "embedded default policy", "{status}");
    assert!(!policy["name"].as_str().unwrap().is_empty(), "{status}");
    assert!(!policy["digest"].as_str().unwrap().is_empty(), "{status}");
    assert_eq!(policy["contract"], "0.2.2", "{status}");
    assert_eq!(policy["settings"]["backoff"]["base_ms"], 20, "{status}");

    let names: Vec<&str> = status["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alpha", "ghost"]);

    let alpha = server_row(&status, "alpha");
    let state_name = alpha["state"].as_str().unwrap();
    assert!(["connected", "healthy"].contains(&state_name), "{alpha}");
    assert_eq!(alpha["transport"], "stdio");
    assert_eq!(alpha["pid"], state.pid().unwrap());
    assert_eq!(alpha["tools"], admin.host.tools("alpha").len());
    assert_eq!(alpha["breaker"], "closed");
    assert_eq!(alpha["failures"], 0);
    assert_eq!(alpha["breaker_failures"], 0);
    assert_eq!(alpha["tool_errors"], 0);
    assert_eq!(alpha["reconnects"], 1);
    assert_eq!(alpha["parks"], 0);
    assert!(alpha["detail"].is_string(), "{alpha}");
    // RFC 3339, UTC, milliseconds: 2024-05-01T12:00:00.123Z
    let since = alpha["since"].as_str().unwrap();
    assert!(
        since.len() == 24 && &since[10..11] == "T" && since.ends_with('Z'),
        "{since}"
    );

    let ghost = server_row(&status, "ghost");
    assert_eq!(ghost["state"], "parked", "{ghost}");
    assert_eq!(ghost["tools"], 0);
    assert_eq!(ghost["pid"], Value::Null);
    assert_eq!(ghost["parks"], 1);
    assert!(
        ghost["last_fault"]
            .as_str()
            .is_some_and(|f| f.contains("/nonexistent/mcp-server")),
        "{ghost}"
    );
    admin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_revives_a_parked_server_and_an_unknown_name_is_404() {
    // Self-probes far away, so only the request can revive it.
    let host = Host::start(PARKED_STAYS_PARKED);
    let admin = Admin::start(host).await;
    let state = admin.host.state_dir("sleepy");
    state.control(json!({"crash_at_startup": 3}));
    admin
        .host
        .supervisor
        .add_server(stdio_fixture("sleepy", &state, &[]))
        .unwrap();
    wait_until("the server parks", || {
        admin.host.view("sleepy").state == ServerState::Parked
    })
    .await;
    assert_eq!(
        server_row(&admin.status().await, "sleepy")["state"],
        "parked"
    );

    let (code, body) = admin
        .call(admin.request(reqwest::Method::POST, "/reconnect/nobody"))
        .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert!(
        body["error"].as_str().unwrap().contains("\"nobody\""),
        "{body}"
    );

    state.control(json!({"crash_at_startup": null}));
    let (code, body) = admin
        .call(admin.request(reqwest::Method::POST, "/reconnect/sleepy"))
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"reconnecting": "sleepy"}));
    wait_until("its tools return", || {
        admin
            .host
            .tools("sleepy")
            .contains(&"sleepy__echo".to_string())
    })
    .await;
    admin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_policy_swap_keeps_the_old_policy_and_a_valid_one_swaps_in() {
    let admin = Admin::start(Host::fast()).await;
    let state = admin.host.state_dir("alpha");
    admin
        .host
        .supervisor
        .add_server(stdio_fixture("alpha", &state, &[]))
        .unwrap();
    wait_until("tools visible", || !admin.host.tools("alpha").is_empty()).await;
    let before = admin.status().await["policy"].clone();

    let (code, body) = admin
        .call(
            admin
                .request(reqwest::Method::PUT, "/policy?label=garbage.wasm")
                .body(b"\0asm this is not a component".to_vec()),
        )
        .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("garbage.wasm") && error.contains("not a valid wasm component"),
        "{error}"
    );
    let (code, body) = admin
        .call(admin.request(reqwest::Method::PUT, "/policy"))
        .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        admin.status().await["policy"],
        before,
        "the old policy runs"
    );

    let (code, body) = admin
        .call(
            admin
                .request(reqwest::Method::PUT, "/policy?label=default%20again.wasm")
                .body(tether::policy::EMBEDDED_DEFAULT_POLICY.to_vec()),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(body["policy"]["label"], "default again.wasm", "{body}");
    assert_eq!(body["policy"]["digest"], before["digest"], "same bytes");
    assert_eq!(body["policy"]["name"], before["name"]);
    let status = admin.status().await;
    assert_eq!(status["policy"]["label"], "default again.wasm");
    // The state moved across: the server keeps its tools and its row.
    assert_eq!(
        server_row(&status, "alpha")["tools"],
        admin.host.tools("alpha").len()
    );
    assert!(!admin.host.tools("alpha").is_empty());
    admin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_patch_names_a_bad_key_and_merges_a_good_one() {
    let admin = Admin::start(Host::fast()).await;
    let patch = |body: &str| {
        admin
            .request(reqwest::Method::PATCH, "/policy/settings")
            .header("content-type", "application/json")
            .body(body.to_string())
    };
    let (code, body) = admin.call(patch(r#"{"breaker": {"bogus": 1}}"#)).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("breaker.bogus"),
        "{body}"
    );
    let (code, body) = admin.call(patch(r#"{"reconnect_budget": 0}"#)).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("reconnect_budget"),
        "{body}"
    );
    let (code, body) = admin.call(patch("not json")).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (code, body) = admin.call(patch("[1, 2]")).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        admin.status().await["policy"]["settings"]["breaker"]["open_ms"],
        300,
        "refusals change nothing"
    );

    let (code, body) = admin.call(patch(r#"{"breaker": {"open_ms": 432}}"#)).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let settings = &admin.status().await["policy"]["settings"];
    assert_eq!(settings["breaker"]["open_ms"], 432, "{settings}");
    // A patch: what it does not name stays as it was.
    assert_eq!(settings["breaker"]["open_max_ms"], 600, "{settings}");
    assert_eq!(settings["backoff"]["base_ms"], 20, "{settings}");
    assert_eq!(&body["settings"], settings);
    admin.stop().await;
}

/// Checks Prometheus text exposition (format 0.0.4) line by line; answers every sample's value by
/// its series (`name{labels}` as written).
fn parse_exposition(text: &str) -> BTreeMap<String, f64> {
    fn is_name(name: &str, colons: bool) -> bool {
        let mut chars = name.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colons && c == ':'))
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':'))
    }
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(is_name(name, true), "bad HELP line: {line}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE has a type");
            assert!(is_name(name, true), "bad TYPE line: {line}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "bad type: {line}"
            );
            assert!(
                types.insert(name.into(), kind.into()).is_none(),
                "TYPE twice: {line}"
            );
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment: {line}");
        if line.trim().is_empty() {
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .unwrap_or_else(|| panic!("no value: {line}"));
        let name = &line[..name_end];
        assert!(is_name(name, true), "bad metric name: {line}");
        let mut rest = &line[name_end..];
        if let Some(labels) = rest.strip_prefix('{') {
            // label="value" pairs with \\, \" and \n escapes.
            let mut chars = labels.char_indices().peekable();
            loop {
                let start = chars.peek().map(|(i, _)| *i).unwrap();
                if labels[start..].starts_with('}') {
                    rest = &labels[start + 1..];
                    break;
                }
                let eq = labels[start..].find('=').expect("label has =") + start;
                assert!(is_name(&labels[start..eq], false), "bad label name: {line}");
                while chars.peek().map(|(i, _)| *i) != Some(eq) {
                    chars.next();
                }
                chars.next();
                assert_eq!(
                    chars.next().map(|(_, c)| c),
                    Some('"'),
                    "unquoted label: {line}"
                );
                loop {
                    match chars.next().map(|(_, c)| c) {
                        Some('\\') => {
                            let escaped = chars.next().map(|(_, c)| c);
                            assert!(
                                matches!(escaped, Some('\\' | '"' | 'n')),
                                "bad escape: {line}"
                            );
                        }
                        Some('"') => break,
                        Some('\n') | None => panic!("unterminated label value: {line}"),
                        Some(_) => {}
                    }
                }
                if chars.peek().map(|(_, c)| *c) == Some(',') {
                    chars.next();
                }
            }
        }
        let mut fields = rest.trim_start_matches(' ').split(' ');
        let value = fields.next().unwrap();
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            other => other
                .parse()
                .unwrap_or_else(|e| panic!("bad value ({e}): {line}")),
        };
        if let Some(timestamp) = fields.next() {
            timestamp.parse::<i64>().expect("timestamp");
        }
        assert!(fields.next().is_none(), "trailing fields: {line}");
        let family = types
            .keys()
            .filter(|family| {
                name == family.as_str()
                    || (types[family.as_str()] == "histogram"
                        && ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|suffix| name == format!("{family}{suffix}")))
            })
            .count();
        assert_eq!(family, 1, "sample of no declared family: {line}");
        samples.insert(line[..line.len() - rest.len()].to_string(), value);
    }
    samples
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_expose_per_server_series_as_prometheus_text() {
    let admin = Admin::start(Host::fast()).await;
    let state = admin.host.state_dir("alpha");
    admin
        .host
        .supervisor
        .add_server(stdio_fixture("alpha", &state, &[]))
        .unwrap();
    wait_until("tools visible", || !admin.host.tools("alpha").is_empty()).await;
    admin.metrics.observe_call(
        "alpha",
        "echo",
        CallResultKind::Ok,
        Duration::from_millis(20),
    );
    admin
        .metrics
        .observe_call("alpha", "echo", CallResultKind::Ok, Duration::from_secs(2));
    admin
        .metrics
        .observe_call("alpha", "echo", CallResultKind::Refused, Duration::ZERO);
    admin.metrics.observe_call(
        "alpha",
        "echo",
        CallResultKind::Timeout,
        Duration::from_secs(10),
    );

    let response = admin
        .request(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let text = response.text().await.unwrap();
    let samples = parse_exposition(&text);
    let value = |series: &str| {
        *samples
            .get(series)
            .unwrap_or_else(|| panic!("no series {series} in\n{text}"))
    };
    let alpha_state = admin.host.view("alpha").state;
    let state_label = match alpha_state {
        ServerState::Connected => "connected",
        ServerState::Healthy => "healthy",
        other => panic!("unexpected state {other:?}"),
    };
    assert_eq!(
        value(&format!(
            "tether_server_state{{server=\"alpha\",state=\"{state_label}\"}}"
        )),
        1.0
    );
    assert_eq!(
        value("tether_server_state{server=\"alpha\",state=\"parked\"}"),
        0.0
    );
    assert_eq!(
        value("tether_server_tools{server=\"alpha\"}"),
        admin.host.tools("alpha").len() as f64
    );
    assert_eq!(
        value("tether_server_reconnects_total{server=\"alpha\"}"),
        1.0
    );
    assert_eq!(value("tether_server_parks_total{server=\"alpha\"}"), 0.0);
    assert_eq!(
        value("tether_server_breaker{server=\"alpha\",state=\"closed\"}"),
        1.0
    );
    assert_eq!(
        value("tether_server_transport{server=\"alpha\",transport=\"stdio\"}"),
        1.0
    );
    assert_eq!(
        value("tether_tool_calls_total{server=\"alpha\",tool=\"echo\",outcome=\"ok\"}"),
        2.0
    );
    assert_eq!(
        value("tether_tool_calls_total{server=\"alpha\",tool=\"echo\",outcome=\"refused\"}"),
        1.0
    );
    assert_eq!(
        value("tether_tool_calls_total{server=\"alpha\",tool=\"echo\",outcome=\"timeout\"}"),
        1.0
    );
    // Refused calls were never sent: no latency for them.
    assert_eq!(
        value("tether_tool_call_duration_seconds_count{server=\"alpha\",tool=\"echo\"}"),
        3.0
    );
    assert_eq!(
        value("tether_tool_call_duration_seconds_bucket{server=\"alpha\",tool=\"echo\",le=\"1\"}"),
        1.0
    );
    assert_eq!(
        value(
            "tether_tool_call_duration_seconds_bucket{server=\"alpha\",tool=\"echo\",le=\"+Inf\"}"
        ),
        3.0
    );
    assert!(value("tether_policy_decisions_total") > 0.0);
    assert!(value("tether_policy_decision_seconds_total") > 0.0);
    assert_eq!(value("tether_policy_faults_total"), 0.0);
    assert_eq!(value("tether_policy_recoveries_total"), 0.0);
    assert_eq!(value("tether_policy_fallbacks_total"), 0.0);
    assert_eq!(value("tether_policy_swaps_total"), 0.0);
    assert_eq!(value("tether_policy_inline_misses_total"), 0.0);
    assert!(
        samples
            .keys()
            .any(|k| k.starts_with("tether_policy_info{label=\"embedded default policy\"")),
        "{text}"
    );
    admin.stop().await;
}

/// Reads server-sent events' data fields as JSON.
struct EventReader {
    body: futures::stream::BoxStream<'static, reqwest::Result<axum::body::Bytes>>,
    buffer: String,
}

impl EventReader {
    async fn open(admin: &Admin) -> EventReader {
        let response = admin
            .request(reqwest::Method::GET, "/events")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        EventReader {
            body: response.bytes_stream().boxed(),
            buffer: String::new(),
        }
    }

    /// The next event, or `None` when the stream ended.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let data: Vec<&str> = block
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if data.is_empty() {
                    continue; // a keep-alive comment
                }
                return Some(serde_json::from_str(&data.join("\n")).expect("event data is JSON"));
            }
            let chunk = self.body.next().await?.ok()?;
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }

    /// Waits for the first event that satisfies `wanted`.
    async fn until(&mut self, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
        let search = async {
            while let Some(event) = self.next().await {
                assert!(event["kind"].is_string(), "{event}");
                assert!(event["time"].is_string(), "{event}");
                if wanted(&event) {
                    return event;
                }
            }
            panic!("the event stream ended before {what}");
        };
        tokio::time::timeout(PATIENCE, search)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_delivers_lifecycle_tool_and_policy_events_until_shutdown() {
    let admin = Admin::start(Host::fast()).await;
    let mut events = EventReader::open(&admin).await;

    let state = admin.host.state_dir("beta");
    admin
        .host
        .supervisor
        .add_server(stdio_fixture("beta", &state, &[]))
        .unwrap();
    let lifecycle = events
        .until("beta's lifecycle event", |e| {
            e["kind"] == "lifecycle" && e["server"] == "beta"
        })
        .await;
    assert!(lifecycle["state"].is_string(), "{lifecycle}");
    assert!(lifecycle["detail"].is_string(), "{lifecycle}");
    let tools = events
        .until("beta's tools", |e| {
            e["kind"] == "tools" && e["server"] == "beta"
        })
        .await;
    assert!(
        tools["added"]
            .as_array()
            .unwrap()
            .contains(&json!("beta__echo")),
        "{tools}"
    );

    // A state change after a crash.
    let pid = state.pid().unwrap();
    kill(pid, 9);
    let lost = events
        .until("beta's tools withdrawn", |e| {
            e["kind"] == "tools" && e["server"] == "beta" && e["removed"] != json!([])
        })
        .await;
    assert!(lost["generation"].as_u64().unwrap() > tools["generation"].as_u64().unwrap());

    let (code, _) = admin
        .call(
            admin
                .request(reqwest::Method::PATCH, "/policy/settings")
                .body(r#"{"breaker": {"open_ms": 400}}"#),
        )
        .await;
    assert_eq!(code, StatusCode::OK);
    events
        .until("the settings notice", |e| {
            e["kind"] == "policy" && e["notice"]["kind"] == "settings-changed"
        })
        .await;

    // Shutting down ends open streams (and does not wait for them).
    let Admin { host, server, .. } = admin;
    tokio::time::timeout(PATIENCE, server.shutdown())
        .await
        .expect("shutdown completes with a stream open");
    let ended =
        tokio::time::timeout(PATIENCE, async { while events.next().await.is_some() {} }).await;
    assert!(ended.is_ok(), "the stream ends at shutdown");
    host.supervisor.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_the_config_or_reports_its_error() {
    let admin = Admin::start(Host::fast()).await;
    let state = admin.host.state_dir("alpha");
    *admin.config.lock().unwrap() = Ok(vec![stdio_fixture("alpha", &state, &[])]);
    let (code, report) = admin
        .call(admin.request(reqwest::Method::POST, "/reload"))
        .await;
    assert_eq!(code, StatusCode::OK, "{report}");
    assert_eq!(
        report,
        json!({"added": ["alpha"], "removed": [], "restarted": [], "unchanged": [],
            "policy_settings_changed": false, "warnings": []})
    );
    wait_until("alpha's tools are visible", || {
        !admin.host.tools("alpha").is_empty()
    })
    .await;

    let (_dir, bad) = bad_config_file("tether.toml", "[servers.alpha]\ncomand = \"fixture\"\n");
    *admin.config.lock().unwrap() = Err(bad.clone());
    let (code, body) = admin
        .call(admin.request(reqwest::Method::POST, "/reload"))
        .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with(&bad.display().to_string()) && error.contains("`alpha`"),
        "{body}"
    );
    assert!(!admin.host.tools("alpha").is_empty(), "nothing changed");
    admin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_bind_is_refused_without_the_flag_and_tokens_are_checked() {
    let host = Host::fast();
    let ctx = || {
        context(
            &host,
            Arc::new(Metrics::new()),
            Arc::new(Mutex::new(Ok(vec![]))),
        )
    };
    let anywhere: SocketAddr = "0.0.0.0:0".parse().unwrap();
    let error = tether::admin::start(anywhere, false, None, ctx())
        .await
        .expect_err("a non-loopback address is refused");
    let message = error.to_string();
    assert!(
        message.contains("0.0.0.0:0") && message.contains("--admin-allow-remote"),
        "{message}"
    );
    let v6: SocketAddr = "[::]:0".parse().unwrap();
    assert!(tether::admin::start(v6, false, None, ctx()).await.is_err());

    let allowed = tether::admin::start(anywhere, true, Some(TOKEN.into()), ctx())
        .await
        .expect("allowed with the flag");
    assert_ne!(allowed.addr.port(), 0);
    allowed.shutdown().await;

    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    for bad in ["", "has space", "new\nline"] {
        assert!(
            tether::admin::start(loopback, false, Some(bad.into()), ctx())
                .await
                .is_err(),
            "token {bad:?}"
        );
    }
    let first = tether::admin::start(loopback, false, None, ctx())
        .await
        .unwrap();
    let second = tether::admin::start(loopback, false, None, ctx())
        .await
        .unwrap();
    assert!(first.token.len() >= 32, "at least 128 bits of hex");
    assert!(first.token.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_ne!(first.token, second.token);
    assert!(
        !format!("{first:?}").contains(&first.token),
        "Debug hides the token"
    );
    first.shutdown().await;
    second.shutdown().await;
    host.supervisor.shutdown().await;
}

#[test]
fn the_state_file_is_private_replaced_atomically_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state").join("tether").join("serve.json");
    let addr: SocketAddr = "127.0.0.1:4321".parse().unwrap();
    state_file::write(&path, addr, "first-token", "http", None).unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    assert_eq!(mode(&dir.path().join("state")), 0o700);
    let state = state_file::read(&path).unwrap();
    assert_eq!(state.addr, addr);
    assert_eq!(state.token, "first-token");
    assert_eq!(state.pid, std::process::id());

    // A second write replaces it whole and leaves no temp file behind.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    state_file::write(
        &path,
        "[::1]:99".parse().unwrap(),
        "second-token",
        "http",
        None,
    )
    .unwrap();
    assert_eq!(mode(&path), 0o600);
    let state = state_file::read(&path).unwrap();
    assert_eq!(state.addr, "[::1]:99".parse::<SocketAddr>().unwrap());
    assert_eq!(state.token, "second-token");
    let entries: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries, ["serve.json"]);

    // Another gateway's file stays; this process's own goes.
    std::fs::write(&path, r#"{"addr": "127.0.0.1:1", "token": "t", "pid": 1}"#).unwrap();
    state_file::remove(&path);
    assert!(path.exists(), "another gateway's state file is left alone");
    state_file::write(&path, addr, "mine", "http", None).unwrap();
    state_file::remove(&path);
    assert!(!path.exists());
    state_file::remove(&path); // nothing to remove: no panic

    std::fs::write(&path, "junk").unwrap();
    let error = state_file::read(&path).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
    assert!(state_file::default_path().ends_with("tether/serve.json"));
}

pub(crate) fn joined<'a>(args: &[&'a str], flags: &[&'a str]) -> Vec<&'a str> {
    [args, flags].concat()
}

/// Runs the real CLI; answers its exit code, stdout and stderr.
pub(crate) async fn cli(args: &[&str]) -> (Option<i32>, String, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_tether-cli"))
        .args(args)
        .env_remove("TETHER_ADMIN_TOKEN")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("the CLI runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_shows_status_as_a_table_and_as_json_and_requests_reconnects() {
    let admin = Admin::start(Host::fast()).await;
    let state = admin.host.state_dir("alpha");
    admin
        .host
        .supervisor
        .add_server(stdio_fixture("alpha", &state, &[]))
        .unwrap();
    wait_until("tools visible", || !admin.host.tools("alpha").is_empty()).await;
    let addr = admin.server.addr.to_string();
    // A state file that does not exist: everything comes from the flags.
    let nowhere = admin.host.dir.path().join("no-state.json");
    let nowhere = nowhere.to_str().unwrap();
    let flags = ["--admin", &addr, "--token", TOKEN, "--state-file", nowhere];
    let with_flags = |args: &[&'static str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend_from_slice(&flags);
        all
    };

    let (code, stdout, stderr) = cli(&with_flags(&["status"])).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("policy: "), "{stdout}");
    let header = lines[1];
    let columns = [
        "NAME",
        "STATE",
        "TRANSPORT",
        "PID",
        "TOOLS",
        "BREAKER",
        "RETRIES",
        "LAST FAULT",
        "SINCE",
    ];
    let mut at = 0;
    for column in columns {
        let found = header[at..]
            .find(column)
            .unwrap_or_else(|| panic!("no {column} after column {at}: {stdout}"));
        at += found + column.len();
    }
    let row: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(row[0], "alpha", "{stdout}");
    assert!(["connected", "healthy"].contains(&row[1]), "{stdout}");
    assert_eq!(row[2], "stdio", "{stdout}");
    assert_eq!(row[3], state.pid().unwrap().to_string(), "{stdout}");
    assert_eq!(
        row[4],
        admin.host.tools("alpha").len().to_string(),
        "{stdout}"
    );
    assert_eq!(row[5], "closed", "{stdout}");
    assert_eq!(row[6], "0", "{stdout}");
    assert!(lines[2].ends_with(" ago"), "{stdout}");

    let (code, stdout, stderr) = cli(&with_flags(&["status", "--json"])).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let status: Value = serde_json::from_str(&stdout).expect("--json prints JSON");
    assert_eq!(server_row(&status, "alpha")["transport"], "stdio");

    let reconnects = admin.host.view("alpha").reconnects;
    let (code, stdout, stderr) = cli(&with_flags(&["reconnect", "alpha"])).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "reconnecting alpha");
    wait_until("the reconnect reaches the server", || {
        admin.host.view("alpha").reconnects > reconnects
    })
    .await;
    wait_until("its tools are back", || {
        !admin.host.tools("alpha").is_empty()
    })
    .await;

    let (code, stdout, stderr) = cli(&with_flags(&["reconnect", "nobody"])).await;
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("no server named \"nobody\""), "{stderr}");
    admin.stop().await;
}

/// `tether tools` says what agents see of each server's tools, under which name, and why
/// not: a tool its filters exclude is listed as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_lists_every_offered_tool_with_what_agents_see_and_why() {
    let admin = Admin::start(Host::fast()).await;
    let state = admin.host.state_dir("alpha");
    let mut spec = stdio_fixture("alpha", &state, &[]);
    spec.exclude = vec!["exit_now".into()];
    admin.host.supervisor.add_server(spec).unwrap();
    wait_until("tools visible", || !admin.host.tools("alpha").is_empty()).await;
    let addr = admin.server.addr.to_string();
    let nowhere = admin.host.dir.path().join("no-state.json");
    let flags = [
        "--admin",
        &addr,
        "--token",
        TOKEN,
        "--state-file",
        nowhere.to_str().unwrap(),
    ];
    let mut json = vec!["tools", "--json"];
    json.extend_from_slice(&flags);
    let (code, stdout, stderr) = cli(&json).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let rows: Vec<Value> = serde_json::from_str(&stdout).expect("--json prints JSON");
    let row = |tool: &str| {
        rows.iter()
            .find(|r| r["original"] == tool)
            .unwrap_or_else(|| panic!("no {tool} in {stdout}"))
            .clone()
    };
    let echo = row("echo");
    assert_eq!(echo["server"], "alpha");
    assert_eq!(echo["advertised"], "alpha__echo");
    assert_eq!(
        (echo["visible"].clone(), echo["why"].clone()),
        (json!(true), json!("published"))
    );
    let excluded = row("exit_now");
    assert_eq!(excluded["visible"], false);
    assert!(excluded["advertised"].is_null());
    assert!(
        excluded["why"].as_str().unwrap().contains("exclude"),
        "{excluded}"
    );

    let mut text = vec!["tools"];
    text.extend_from_slice(&flags);
    let (code, stdout, _) = cli(&text).await;
    assert_eq!(code, Some(0));
    assert!(
        stdout.lines().next().unwrap().contains("AGENTS SEE"),
        "{stdout}"
    );
    let line = stdout.lines().find(|l| l.contains("exit_now")).unwrap();
    assert!(
        line.trim_start().starts_with('-') && line.contains("exclude"),
        "{stdout}"
    );
    admin.stop().await;
}

/// `tether --version` and `tether version --json` say what the build is.
#[tokio::test]
async fn the_version_names_the_commit_target_wasmtime_and_contract_lines() {
    let (code, stdout, stderr) = cli(&["--version"]).await;
    assert_eq!(code, Some(0), "{stderr}");
    for part in [
        &format!("tether {}", env!("CARGO_PKG_VERSION")),
        "commit:",
        "target:",
        "wasmtime:  48.",
        "tether:policy 0.2.0 to 0.2.2",
        "tether:policy 0.1.0",
    ] {
        assert!(stdout.contains(part), "{part:?} in {stdout}");
    }
    let (code, stdout, stderr) = cli(&["version", "--json"]).await;
    assert_eq!(code, Some(0), "{stderr}");
    let build: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(build["version"], env!("CARGO_PKG_VERSION"));
    assert!(
        build["target"].as_str().unwrap().contains("linux"),
        "{build}"
    );
    // The checkout's commit (with `-modified` for uncommitted changes); "unknown" only
    // outside a git checkout.
    let head = std::process::Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string());
    let commit = build["commit"].as_str().unwrap();
    match head {
        Some(head) => assert!(head.starts_with(&commit[..12]), "{commit} is not {head}"),
        None => assert_eq!(commit, "unknown"),
    }
    assert_eq!(build["contracts"][0]["newest"], "0.2.2", "{build}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_finds_the_gateway_through_the_state_file_and_explains_failures() {
    let admin = Admin::start(Host::fast()).await;
    let addr = admin.server.addr;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("serve.json");
    let path_str = path.to_str().unwrap();

    // No state file: no gateway to reach (exit 3, not a usage error).
    let (code, _, stderr) = cli(&["status", "--state-file", path_str]).await;
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains(&format!("no running gateway found (looked in {path_str})"))
            && stderr.contains("--admin"),
        "{stderr}"
    );

    // The state file names this process, which holds its lock as a gateway does, and the
    // admin API.
    let _lock = state_file::lock(&path).unwrap();
    state_file::write(&path, addr, TOKEN, "http", None).unwrap();
    let (code, stdout, stderr) = cli(&["status", "--state-file", path_str]).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("no servers configured"), "{stdout}");
    // --admin naming the same address takes the token from the state file.
    let addr_str = addr.to_string();
    let (code, stdout, stderr) = cli(&[
        "status",
        "--json",
        "--admin",
        &addr_str,
        "--state-file",
        path_str,
    ])
    .await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");

    // A wrong token.
    let (code, _, stderr) = cli(&[
        "status",
        "--admin",
        &addr_str,
        "--token",
        "wrong",
        "--state-file",
        path_str,
    ])
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("the admin token was refused"), "{stderr}");

    // Nothing listens there.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let (code, _, stderr) = cli(&[
        "status",
        "--admin",
        &closed,
        "--token",
        TOKEN,
        "--state-file",
        path_str,
    ])
    .await;
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot reach the gateway at {closed}")),
        "{stderr}"
    );

    // --admin elsewhere without a token.
    let (code, _, stderr) = cli(&["status", "--admin", &closed, "--state-file", path_str]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--token"), "{stderr}");

    // A state file left behind by a gateway that is gone.
    std::fs::write(
        &path,
        json!({"addr": addr_str, "token": TOKEN, "pid": 999_999_999u32}).to_string(),
    )
    .unwrap();
    let (code, _, stderr) = cli(&["status", "--state-file", path_str]).await;
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.contains("no longer running"), "{stderr}");

    // Settings refused by the policy: exit 1 with its reason; good ones apply.
    let flags = [
        "--admin",
        &addr_str,
        "--token",
        TOKEN,
        "--state-file",
        path_str,
    ];
    let (code, _, stderr) = cli(&joined(&["policy", "set", r#"{"bogus": 1}"#], &flags)).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("bogus"), "{stderr}");
    let (code, stdout, stderr) = cli(&joined(
        &["policy", "set", r#"{"breaker": {"open_ms": 450}}"#],
        &flags,
    ))
    .await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("\"open_ms\":450"), "{stdout}");

    // A swap: a refused component is exit 1 with the reason; the default's bytes swap in.
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"\0asm junk").unwrap();
    let (code, _, stderr) = cli(&joined(&["policy", "swap", junk.to_str().unwrap()], &flags)).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("junk.wasm"), "{stderr}");
    let good = dir.path().join("default.wasm");
    std::fs::write(&good, tether::policy::EMBEDDED_DEFAULT_POLICY).unwrap();
    let (code, stdout, stderr) =
        cli(&joined(&["policy", "swap", good.to_str().unwrap()], &flags)).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("policy swapped: now running "),
        "{stdout}"
    );
    assert!(stdout.contains("(default.wasm, digest "), "{stdout}");

    // A reload, and one refused for a bad config.
    let (code, stdout, stderr) = cli(&joined(&["reload"], &flags)).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("configuration reloaded"), "{stdout}");
    let (_dir, bad) = bad_config_file("tether.json", "{ not json");
    *admin.config.lock().unwrap() = Err(bad.clone());
    let (code, _, stderr) = cli(&joined(&["reload"], &flags)).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr
            .trim()
            .starts_with(&format!("error: {}", bad.display())),
        "{stderr}"
    );
    admin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_prints_one_line_per_event() {
    let admin = Admin::start(Host::fast()).await;
    let addr = admin.server.addr.to_string();
    let nowhere = admin.host.dir.path().join("no-state.json");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tether-cli"))
        .args(["events", "--admin", &addr, "--token", TOKEN, "--state-file"])
        .arg(&nowhere)
        .env_remove("TETHER_ADMIN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the CLI runs");
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let watching = tokio::time::timeout(PATIENCE, stderr.next_line())
        .await
        .expect("the CLI connects")
        .unwrap()
        .unwrap_or_default();
    assert!(watching.starts_with("watching events"), "{watching}");

    let state = admin.host.state_dir("gamma");
    admin
        .host
        .supervisor
        .add_server(stdio_fixture("gamma", &state, &[]))
        .unwrap();
    // Lines like "2024-05-01T12:00:00Z  gamma: connected - ..." and "... gamma: tools +gamma__echo ...".
    let mut seen = Vec::new();
    let printed = tokio::time::timeout(PATIENCE, async {
        let (mut lifecycle, mut tools) = (false, false);
        while !(lifecycle && tools) {
            let Some(line) = stdout.next_line().await.unwrap() else {
                return false;
            };
            lifecycle |= line.contains("  gamma: connect");
            tools |= line.contains("  gamma: tools +") && line.contains(" +gamma__echo ");
            seen.push(line);
        }
        true
    })
    .await;
    if printed != Ok(true) {
        child.start_kill().unwrap();
        let mut rest = Vec::new();
        while let Ok(Some(line)) = stderr.next_line().await {
            rest.push(line);
        }
        panic!("a lifecycle line and a tools line are printed: {seen:#?}\nstderr: {rest:#?}");
    }

    // The gateway going away ends the command.
    let Admin { host, server, .. } = admin;
    server.shutdown().await;
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("the CLI ends with the stream")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    host.supervisor.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policy_reports_divergences_on_live_inputs_and_is_promoted_or_dropped() {
    let admin = Admin::start(Host::fast()).await;
    let addr = admin.server.addr.to_string();
    let nowhere = admin.host.dir.path().join("no-state.json");
    let nowhere = nowhere.to_str().unwrap();
    let flags = ["--admin", &addr, "--token", TOKEN, "--state-file", nowhere];
    let steady = admin.host.state_dir("steady");
    admin
        .host
        .supervisor
        .add_server(stdio_fixture("steady", &steady, &[]))
        .unwrap();
    wait_until("tools visible", || !admin.host.tools("steady").is_empty()).await;
    let mut events = admin.host.supervisor.policy().notices();

    // The shadow is the policy that trusts bare handshakes: given the live state by handover.
    let wrong = tether_tests::components::WRONG;
    let (code, stdout, stderr) = cli(&joined(&["policy", "shadow", wrong], &flags)).await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("given the live state by handover"),
        "{stdout}"
    );

    // Live inputs: calls, and a crash with its respawn, whose fresh session the shadow
    // calls proven at once, and the live policy does not.
    let (flaky, pid) = (admin.host.state_dir("flaky"), steady.pid().unwrap());
    admin
        .host
        .supervisor
        .add_server(stdio_fixture("flaky", &flaky, &[]))
        .unwrap();
    wait_until("tools visible", || !admin.host.tools("flaky").is_empty()).await;
    let result = admin
        .host
        .supervisor
        .call_tool("steady__echo", args(json!({"text": "x"})))
        .await
        .unwrap();
    assert_eq!(text(&result), "x");
    kill(pid, 9);
    wait_until("steady is back", || {
        steady.pid().is_some_and(|p| p != pid) && !admin.host.tools("steady").is_empty()
    })
    .await;

    let (code, report) = admin.get("/policy/shadow").await;
    assert_eq!(code, StatusCode::OK);
    let shadow = &report["shadow"];
    assert!(shadow["decisions"].as_u64().unwrap() > 3, "{report}");
    assert!(shadow["divergences"].as_u64().unwrap() >= 1, "{report}");
    assert!(
        shadow["by_kind"]["connected actions"].as_u64().unwrap() >= 1,
        "{report}"
    );
    assert!(shadow["first_per_server"]["flaky"].is_object(), "{report}");
    // The live policy is untouched: still the default, sessions as they were.
    assert_eq!(
        admin.host.supervisor.policy().running().name,
        "tether-default-policy"
    );
    let mut diverged = false;
    while let Ok(notice) = events.try_recv() {
        diverged |= matches!(notice, tether::policy::PolicyNotice::ShadowDiverged { .. });
    }
    assert!(diverged, "a divergence notice reaches `tether events`");
    let (code, stdout, _) = cli(&joined(&["policy", "shadow"], &flags)).await;
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("differ") && stdout.contains("first on flaky"),
        "{stdout}"
    );

    // It breaks an invariant: promoting it takes --force, and the answer names what it breaks.
    let (code, _, stderr) = cli(&joined(&["policy", "swap", "--from-shadow"], &flags)).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("handshake-alone-does-not-reset-the-budget") && stderr.contains("--force"),
        "{stderr}"
    );
    // Promoted: a swap to it, keeping the sessions.
    let pids = (steady.pid(), flaky.pid());
    let (code, stdout, stderr) = cli(&joined(
        &["policy", "swap", "--from-shadow", "--force"],
        &flags,
    ))
    .await;
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("wrong-test-policy"), "{stdout}");
    assert!(
        stdout.contains("breaks Tether's invariant handshake-alone-does-not-reset-the-budget"),
        "{stdout}"
    );
    assert_eq!((steady.pid(), flaky.pid()), pids);
    let (code, report) = admin.get("/policy/shadow").await;
    assert_eq!((code, &report["shadow"]), (StatusCode::OK, &Value::Null));
    // Nothing to promote or drop now.
    let (code, _, stderr) = cli(&joined(&["policy", "swap", "--from-shadow"], &flags)).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no shadow policy"), "{stderr}");
    let (code, _, _) = cli(&joined(&["policy", "shadow", wrong], &flags)).await;
    assert_eq!(code, Some(0));
    let (code, stdout, _) = cli(&joined(&["policy", "shadow", "--drop"], &flags)).await;
    assert_eq!(code, Some(0));
    assert!(stdout.contains("shadow policy dropped"), "{stdout}");
    admin.stop().await;
}
