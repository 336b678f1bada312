//! A short chaos soak (`tether_tests::chaos`): the real `tether serve --http` in front of six
//! fixture servers (two each over stdio, Streamable HTTP and legacy SSE), three MCP clients
//! calling tools through it, and a seeded schedule that kills, hangs, flaps, restarts and
//! garbles the servers for a few seconds. Its assertions are invariants, never timings: every
//! call answered or clearly refused within its deadline, no call of a non-read-only tool run
//! twice, no phantom tool once things settle, no process left after shutdown, memory bounded.
//!
//! `TETHER_CHAOS_SEED` and `TETHER_CHAOS_SECONDS` replay or lengthen it, `TETHER_CHAOS_KEEP`
//! keeps its directory (gateway log, fixture state, `calls.tsv`); `tether-bench chaos` runs
//! the long version.

use std::time::Duration;

use tether_tests::chaos;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_chaos_soak_keeps_every_invariant() {
    let dir = tempfile::Builder::new()
        .prefix("tether-chaos-")
        .tempdir()
        .expect("temp dir");
    let mut options = chaos::Options::new(
        env!("CARGO_BIN_EXE_tether-cli").into(),
        env!("CARGO_BIN_EXE_mcp-fixture").into(),
        dir.path().to_path_buf(),
    );
    options.seconds = env_or("TETHER_CHAOS_SECONDS", 6.0);
    options.seed = env_or("TETHER_CHAOS_SEED", 7);
    options.servers = 6;
    options.clients = 3;
    options.lanes = 4;
    options.settle_within = Duration::from_secs(30);
    let report = chaos::run(&options).await.expect("the soak runs");
    print!("{}", report.render());
    let failures = report.failures();
    if std::env::var_os("TETHER_CHAOS_KEEP").is_some() {
        println!("kept {}", dir.keep().display());
        assert!(failures.is_empty(), "- {}", failures.join("\n- "));
    } else if !failures.is_empty() {
        let kept = dir.keep();
        panic!(
            "chaos invariants broke (seed {}; fixture state and the gateway's log kept in {}):\n- {}",
            options.seed,
            kept.display(),
            failures.join("\n- ")
        );
    }
}

/// Every kind of garbage (not JSON, JSON that is not JSON-RPC, an answer with an id no request
/// has) on every transport: the call ran once and Tether answers the agent with a timeout or a
/// lost connection, never a result, and the server is usable again once it stops garbling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_answers_time_out_or_fail_cleanly_on_every_transport() {
    use std::sync::Arc;

    use serde_json::json;
    use tether_tests::chaos::clients::{self, Calls, Outcome, ToolKind};
    use tether_tests::chaos::gateway::Gateway;
    use tether_tests::chaos::report::Executions;

    let dir = tempfile::tempdir().expect("temp dir");
    let fixture = std::path::Path::new(env!("CARGO_BIN_EXE_mcp-fixture"));
    let (servers, config) = chaos::fleet(fixture, dir.path(), 3, 0)
        .await
        .expect("fixtures start");
    for server in &servers {
        server.control(json!({"garbage": true}));
    }
    let gateway = Gateway::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_tether-cli")),
        dir.path(),
        &config,
        &chaos::policy_settings(0),
    )
    .await
    .expect("tether serve starts");
    let (client, _) = clients::connect(&gateway.url).await.expect("MCP session");
    let peer = client.peer().clone();
    let by = tokio::time::Instant::now() + Duration::from_secs(30);
    while clients::list(&peer).await.unwrap_or_default().len() < 9 {
        assert!(tokio::time::Instant::now() < by, "tools listed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Three garbled calls per server, one after the other (the fixture cycles through the three
    // kinds); the servers at once.
    let calls = Arc::new(Calls::new(
        tokio::time::Instant::now(),
        chaos::DEADLINE + chaos::MARGIN,
    ));
    let mut tasks = Vec::new();
    for server in &servers {
        let (calls, peer, server) = (calls.clone(), peer.clone(), server.clone());
        tasks.push(tokio::spawn(async move {
            let tool = format!("{}__side_effect", server.name);
            let by = tokio::time::Instant::now() + Duration::from_secs(30);
            // Until three calls ran (refusals while a session comes back do not count).
            while server.calls_log().lines().count() < 3 && tokio::time::Instant::now() < by {
                let outcome = calls
                    .call(&peer, None, &server.name, ToolKind::SideEffect, &tool)
                    .await;
                if matches!(outcome, Outcome::NotSent(_)) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let garbled: Vec<_> = calls.records.lock().unwrap().clone();

    // Healthy again: each server answers (after a reconnect or a breaker's cooldown).
    for server in &servers {
        server.clear_control();
        let tool = format!("{}__echo", server.name);
        let by = tokio::time::Instant::now() + Duration::from_secs(30);
        while calls
            .call(&peer, None, &server.name, ToolKind::Echo, &tool)
            .await
            != Outcome::Ok
        {
            assert!(
                tokio::time::Instant::now() < by,
                "{} answers again once it stops garbling",
                server.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let _ = client.cancel().await;
    let (code, _, _) = gateway.terminate(Duration::from_secs(45)).await;
    assert_eq!(code, Some(0), "tether serve exits cleanly");
    for server in &servers {
        if let Some(keeper) = &server.keeper {
            keeper.stop().await;
        }
    }

    let records = calls.records.lock().unwrap().clone();
    let logs: Vec<(String, String)> = servers
        .iter()
        .map(|s| (s.name.clone(), s.calls_log()))
        .collect();
    let executions = Executions::check(&records, &logs);
    for record in &garbled {
        println!(
            "{:<9} {:?} after {} ms",
            record.server,
            record.outcome,
            record.latency.as_millis()
        );
        assert!(
            matches!(
                record.outcome,
                Outcome::TimedOut | Outcome::Lost | Outcome::NotSent(_)
            ),
            "{}: a garbled answer must end as a timeout or a lost connection (or, once the \
             session is gone, a refusal), not {:?}",
            record.server,
            record.outcome
        );
    }
    for server in &servers {
        let ran = garbled
            .iter()
            .filter(|r| r.server == server.name)
            .filter(|r| !matches!(r.outcome, Outcome::NotSent(_)))
            .count();
        assert_eq!(ran, 3, "{}: three calls were garbled", server.name);
    }
    assert!(executions.duplicates.is_empty(), "{executions:?}");
    assert!(executions.refused_but_executed.is_empty(), "{executions:?}");
    assert!(executions.ok_not_executed.is_empty(), "{executions:?}");
    assert!(executions.misrouted.is_empty(), "{executions:?}");
    assert!(executions.unattributed.is_empty(), "{executions:?}");
}
