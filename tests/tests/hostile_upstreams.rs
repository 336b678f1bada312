//! Hostile upstreams: answers larger than `max_message`, lines and events without end, invalid
//! tools, notification floods, requests Tether cannot serve. Memory stays bounded by
//! configuration, a bad item never hides the rest, and calls fail at once with clear words.

use std::time::{Duration, Instant};

use crate::common::*;
use tether::config::{ServerSpec, TransportSpec};
use tether::policy::ServerState;

const HOSTILE: &str = env!("CARGO_BIN_EXE_mcp-hostile");

/// The tests here measure this process's memory: they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const MIB: usize = 1 << 20;

fn hostile(name: &str, args: &[&str]) -> ServerSpec {
    let mut spec = ServerSpec::stdio(name, HOSTILE, args);
    spec.timeouts = test_timeouts();
    // Long enough that "failed at once" cannot be a timeout in disguise.
    spec.timeouts.call = Duration::from_secs(60);
    spec.timeouts.call_max = Duration::from_secs(60);
    spec.max_message = MIB;
    spec
}

async fn healthy(host: &Host, server: &str) {
    wait_until(&format!("{server} is healthy"), || {
        host.view(server).state == ServerState::Healthy
    })
    .await;
}

/// Resident memory of this test process, in bytes.
fn rss() -> usize {
    proc_status_kib(std::process::id(), "VmRSS:") * 1024
}

fn proc_status_kib(pid: u32, key: &str) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Fails unless this process's resident memory grew by less than 64 MiB since `before`;
/// prints the growth (`--nocapture`) for docs/LIMITS.md.
fn assert_memory_bounded(before: usize) {
    let grown = rss().saturating_sub(before);
    eprintln!(
        "resident memory grew by {:.1} MiB",
        grown as f64 / MIB as f64
    );
    assert!(
        grown < 64 * MIB,
        "resident memory grew by {} MiB",
        grown / MIB
    );
}

/// Bytes a process has written so far.
fn written(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("wchar:"))
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or(0)
}

async fn call(host: &Host, tool: &str, arguments: serde_json::Value) -> (String, bool, Duration) {
    let started = Instant::now();
    let result = host
        .supervisor
        .call_tool(tool, args(arguments))
        .await
        .expect("routed");
    (text(&result), is_error(&result), started.elapsed())
}

#[tokio::test]
async fn an_oversized_answer_fails_its_call_at_once_and_the_session_lives_on() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let host = Host::fast();
    for (name, layout) in [("first", "id-first"), ("last", "id-last")] {
        host.supervisor
            .add_server(hostile(name, &["huge-answer", "3000000", layout]))
            .unwrap();
        healthy(&host, name).await;
        let (words, failed, took) =
            call(&host, &format!("{name}__big"), serde_json::json!({})).await;
        assert!(failed, "{words}");
        assert!(
            words.contains("larger than Tether's limit of 1 MiB")
                && words.contains("max_message")
                && words.contains(&format!("Server \"{name}\" ran the call")),
            "{words}"
        );
        assert!(took < Duration::from_secs(20), "{took:?}");
        // Only that answer was dropped: the same session answers the next call.
        let (words, failed, _) = call(
            &host,
            &format!("{name}__echo"),
            serde_json::json!({"text": "still here"}),
        )
        .await;
        assert!(!failed && words == "still here", "{words}");
        assert_eq!(host.view(name).state, ServerState::Healthy);
    }
}

/// A Streamable HTTP server's answer over `max_message`, streamed (SSE) or as one JSON body:
/// the call fails at once with Tether's words, and the same session answers the next call.
#[tokio::test]
async fn an_oversized_http_answer_fails_its_call_at_once_and_the_session_lives_on() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let host = Host::fast();
    let streamed = ["--tools", "blob"];
    let json = ["--tools", "blob", "--json-response"];
    for (name, flags) in [("streamed", &streamed[..]), ("json", &json[..])] {
        let state = host.state_dir(name);
        let server = HttpFixture::start("http", &state, "127.0.0.1:0", flags).await;
        let transport = TransportSpec::Http {
            url: String::new(),
            headers: Default::default(),
            sse_fallback: false,
        };
        let mut spec = http_spec(name, format!("http://{}/mcp", server.addr), transport);
        spec.max_message = 64 << 10;
        spec.timeouts.call = Duration::from_secs(60);
        spec.timeouts.call_max = Duration::from_secs(60);
        host.supervisor.add_server(spec).unwrap();
        let blob = format!("{name}__blob");
        wait_until("the tools are published", || {
            host.tools(name).contains(&blob)
        })
        .await;
        let generation = host.supervisor.registry().generation();
        let (words, failed, took) = call(&host, &blob, serde_json::json!({"bytes": 200_000})).await;
        assert!(failed, "{words}");
        assert!(
            words.contains("larger than Tether's limit of 64 KiB") && words.contains("max_message"),
            "{name}: {words}"
        );
        assert!(took < Duration::from_secs(20), "{took:?}");
        // Within the limit, the same session answers.
        let (words, failed, _) = call(&host, &blob, serde_json::json!({"bytes": 60_000})).await;
        assert!(
            !failed && words.len() == 60_000,
            "{name}: {}",
            &words[..100.min(words.len())]
        );
        assert_eq!(host.view(name).state, ServerState::Healthy);
        assert_eq!(
            host.supervisor.registry().generation(),
            generation,
            "{name}: the tools stayed"
        );
    }
}

/// A child that closes its stdout and lives on ends its session as such (not as "exited"),
/// within the short wait for an exit; it is then stopped and reaped, and a new one started.
#[tokio::test]
async fn a_child_that_closes_its_stdout_and_lives_on_is_ended_and_reaped() {
    let host = Host::fast();
    let mut spec = hostile("mute", &["closes-stdout"]);
    spec.timeouts.stop_grace = Duration::from_millis(200);
    host.supervisor.add_server(spec).unwrap();
    healthy(&host, "mute").await;
    let pid = host.view("mute").pid.expect("a stdio child");
    let (words, failed, took) = call(&host, "mute__big", serde_json::json!({})).await;
    assert!(failed && words.contains("lost"), "{words}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    wait_until("the fault names the closed stdout", || {
        host.view("mute")
            .last_fault
            .is_some_and(|fault| fault.contains("closed its stdout but did not exit"))
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while process_exists(pid) {
        assert!(
            Instant::now() < deadline,
            "the mute child {pid} was never reaped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_until("a new child", || {
        host.view("mute").pid.is_some_and(|new| new != pid)
    })
    .await;
}

#[tokio::test]
async fn an_answer_without_end_fails_at_once_and_memory_stays_bounded() {
    if !in_own_process(
        "hostile_upstreams::an_answer_without_end_fails_at_once_and_memory_stays_bounded",
    ) {
        return;
    }
    let _serial = ONE_AT_A_TIME.lock().await;
    let host = Host::fast();
    host.supervisor
        .add_server(hostile("endless", &["endless-line"]))
        .unwrap();
    healthy(&host, "endless").await;
    let pid = host.view("endless").pid.expect("a child");
    let before = rss();
    let (words, failed, took) = call(&host, "endless__big", serde_json::json!({})).await;
    assert!(
        failed && words.contains("larger than Tether's limit"),
        "{words}"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
    // The server goes on writing its endless line; Tether reads and drops it.
    wait_until("the server has written 256 MiB", || {
        written(pid) > 256 * MIB as u64
    })
    .await;
    assert_memory_bounded(before);
}

#[tokio::test]
async fn a_tool_list_larger_than_max_message_in_all_is_a_clear_fault() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let host = Host::start(PARKED_STAYS_PARKED);
    // 8 pages of 200 KB: each page is within 1 MiB, all together are not.
    host.supervisor
        .add_server(hostile("pages", &["huge-tools", "8", "200000"]))
        .unwrap();
    wait_until("the server parks", || {
        host.view("pages").state == ServerState::Parked
    })
    .await;
    let fault = host.view("pages").last_fault.unwrap_or_default();
    assert!(
        fault.contains("tool list is larger than max_message (1 MiB)"),
        "{fault}"
    );
    assert!(host.tools("pages").is_empty());
}

#[tokio::test]
async fn a_single_tools_list_answer_over_max_message_is_a_clear_fault() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let host = Host::start(PARKED_STAYS_PARKED);
    // One page, one tool with a 2 MB description: the answer itself is over 1 MiB.
    host.supervisor
        .add_server(hostile("page", &["huge-tools", "1", "2000000"]))
        .unwrap();
    wait_until("the server parks", || {
        host.view("page").state == ServerState::Parked
    })
    .await;
    let fault = host.view("page").last_fault.unwrap_or_default();
    assert!(
        fault.contains("tools/list answer is larger than max_message (1 MiB)"),
        "{fault}"
    );
}

#[tokio::test]
async fn invalid_tools_are_skipped_and_the_others_published() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let host = Host::fast();
    host.supervisor
        .add_server(hostile("bad", &["bad-tools"]))
        .unwrap();
    healthy(&host, "bad").await;
    wait_until("the valid tools are published", || {
        host.tools("bad") == ["bad__echo", "bad__good"]
    })
    .await;
    let (words, failed, _) = call(&host, "bad__echo", serde_json::json!({"text": "ok"})).await;
    assert!(!failed && words == "ok", "{words}");
}

#[tokio::test]
async fn a_flood_of_list_changes_is_coalesced() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let host = Host::fast();
    let lists = host.dir.path().join("lists.log");
    let count = || {
        std::fs::read_to_string(&lists)
            .unwrap_or_default()
            .lines()
            .count()
    };
    host.supervisor
        .add_server(hostile(
            "flood",
            &["list-changed-flood", "20000", lists.to_str().unwrap()],
        ))
        .unwrap();
    healthy(&host, "flood").await;
    // Settled: the count stops moving between two looks 200 ms apart (one refresh in flight
    // and one pending at most), within the test's patience.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut last = count();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = count();
        if now == last && now > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "refreshes never settle: {now}"
        );
        last = now;
    }
    // The initial list, then at most a handful: never one per notification.
    assert!(
        count() <= 10,
        "{} tools/list for 20000 notifications",
        count()
    );
    let (words, failed, _) = call(&host, "flood__echo", serde_json::json!({"text": "ok"})).await;
    assert!(!failed && words == "ok", "{words}");
}

#[tokio::test]
async fn a_logging_flood_is_dropped_over_the_rate_and_counted() {
    if !in_own_process("hostile_upstreams::a_logging_flood_is_dropped_over_the_rate_and_counted") {
        return;
    }
    let _serial = ONE_AT_A_TIME.lock().await;
    let host = Host::fast();
    let dropped_before = tether::transport::gate::dropped_notifications();
    let before = rss();
    host.supervisor
        .add_server(hostile("chatty", &["log-flood", "200000", "1000"]))
        .unwrap();
    healthy(&host, "chatty").await;
    let pid = host.view("chatty").pid.expect("a child");
    wait_until("the flood is written", || written(pid) > 190 * MIB as u64).await;
    let started = Instant::now();
    let (words, failed, _) = call(&host, "chatty__echo", serde_json::json!({"text": "ok"})).await;
    assert!(!failed && words == "ok", "{words}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let dropped = tether::transport::gate::dropped_notifications() - dropped_before;
    assert!(dropped > 100_000, "only {dropped} notifications dropped");
    assert_memory_bounded(before);
}

/// A call made without a client (the library's `call_tool`) has nobody to ask: the server's
/// sampling request is refused at once, saying why, and the call goes on.
#[tokio::test]
async fn sampling_requests_with_no_client_to_ask_are_refused_with_an_error() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let host = Host::fast();
    host.supervisor
        .add_server(hostile("sampler", &["sampling"]))
        .unwrap();
    healthy(&host, "sampler").await;
    let (words, failed, _) = call(&host, "sampler__big", serde_json::json!({})).await;
    assert!(!failed, "{words}");
    assert!(
        words.starts_with("sampling refused:")
            && words.contains("through Tether is refused: no client's request is waiting for it"),
        "{words}"
    );
}

/// A server's request over `max_message` is dropped unread, and the server is told so at once
/// (it used to wait for an answer that never came).
#[tokio::test]
async fn a_servers_request_over_the_limit_is_answered_with_why_it_was_dropped() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let host = Host::fast();
    host.supervisor
        .add_server(hostile("asker", &["sampling", "3000000"]))
        .unwrap();
    healthy(&host, "asker").await;
    let (words, failed, took) = call(&host, "asker__big", serde_json::json!({})).await;
    assert!(!failed, "{words}");
    assert!(
        words.starts_with("sampling refused: Tether dropped this request unread")
            && words.contains("MiB) is larger than Tether's limit of 1 MiB")
            && words.contains("max_message"),
        "{words}"
    );
    // The server gives up waiting after 10 s; it was told well before.
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert_eq!(host.view("asker").state, ServerState::Healthy);
}

/// A legacy SSE server whose first event never ends: Tether's memory stays bounded and the
/// connect attempt fails within its deadline.
#[tokio::test]
async fn an_sse_event_without_end_is_bounded() {
    if !in_own_process("hostile_upstreams::an_sse_event_without_end_is_bounded") {
        return;
    }
    let _serial = ONE_AT_A_TIME.lock().await;
    use axum::body::Body;
    use futures::StreamExt;

    let app = axum::Router::new().route(
        "/sse",
        axum::routing::get(|| async {
            let start = futures::stream::once(async {
                Ok::<_, std::io::Error>(axum::body::Bytes::from_static(b"event: message\ndata: "))
            });
            let endless = futures::stream::repeat_with(|| {
                Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![b'z'; 64 << 10]))
            });
            axum::response::Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(start.chain(endless)))
                .unwrap()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let host = Host::start(PARKED_STAYS_PARKED);
    let mut spec = http_spec(
        "endless-sse",
        format!("http://{addr}/sse"),
        TransportSpec::Sse {
            url: String::new(),
            headers: Default::default(),
        },
    );
    spec.max_message = MIB;
    spec.timeouts.connect = Duration::from_secs(3);
    let before = rss();
    host.supervisor.add_server(spec).unwrap();
    wait_until("the connect attempt fails", || {
        host.view("endless-sse").last_fault.is_some()
    })
    .await;
    assert_memory_bounded(before);
    // The fault names the oversized message, not a timeout.
    let fault = host.view("endless-sse").last_fault.unwrap();
    assert!(fault.contains("larger than max_message (1 MiB)"), "{fault}");
}

/// A policy that fails on everything (a hostile component, no fallback): the server does not
/// sit "connecting" without a word; the failure is its visible fault.
#[tokio::test]
async fn a_policy_that_cannot_take_a_server_leaves_a_visible_fault() {
    use tether::policy::{PolicyRuntime, PolicySource, RuntimeOptions};
    let _serial = ONE_AT_A_TIME.lock().await;
    let policy = PolicyRuntime::start(RuntimeOptions {
        source: PolicySource::File(env!("TETHER_TEST_POLICY_HOSTILE").into()),
        // Every instance panics on its first event, so recovery fails too.
        settings: r#"{"hostile": {"panic_on_event": 1}}"#.into(),
        fallback_to_default: false,
        inline_fuel: 0,
        ..RuntimeOptions::default()
    })
    .expect("the policy starts");
    let dir = tempfile::tempdir().unwrap();
    let supervisor = tether::supervisor::Supervisor::start(policy, dir.path().join("logs"));
    supervisor
        .add_server(hostile("orphan", &["bad-tools"]))
        .unwrap();
    let fault = || {
        supervisor
            .views()
            .into_iter()
            .find(|v| v.name == "orphan")
            .and_then(|v| v.last_fault)
            .unwrap_or_default()
    };
    wait_until("the failure shows", || {
        fault().contains("the policy could not take this server")
    })
    .await;
    supervisor.shutdown().await;
}
