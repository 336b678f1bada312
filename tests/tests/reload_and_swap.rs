//! Operations on a live host: config reloads that touch only what changed, and policy swaps
//! under continuous calls.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::*;
use serde_json::json;
use tether::policy::{BreakerState, PolicySource};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_starts_added_stops_removed_restarts_changed_and_leaves_the_rest_alone() {
    let host = Host::fast();
    let (keep, drop_me, change) = (
        host.state_dir("keep"),
        host.state_dir("dropme"),
        host.state_dir("change"),
    );
    let keep_spec = stdio_fixture("keep", &keep, &[]);
    let drop_spec = stdio_fixture("dropme", &drop_me, &[]);
    let change_spec = stdio_fixture("change", &change, &[]);
    for spec in [keep_spec.clone(), drop_spec, change_spec.clone()] {
        host.supervisor.add_server(spec).unwrap();
    }
    for name in ["keep", "dropme", "change"] {
        wait_until("tools visible", || !host.tools(name).is_empty()).await;
    }
    let (keep_pid, drop_pid, change_pid) = (
        keep.pid().unwrap(),
        drop_me.pid().unwrap(),
        change.pid().unwrap(),
    );

    let added = host.state_dir("added");
    let mut changed = change_spec.clone();
    changed.exclude = vec!["exit_now".into()];
    let report = host
        .supervisor
        .reload(vec![
            keep_spec,
            changed,
            stdio_fixture("added", &added, &[]),
        ])
        .await;
    assert_eq!(report.added, ["added"]);
    assert_eq!(report.removed, ["dropme"]);
    assert_eq!(report.restarted, ["change"]);
    assert_eq!(report.unchanged, ["keep"]);

    wait_until("the added server is up", || !host.tools("added").is_empty()).await;
    wait_until("the changed server is back", || {
        !host.tools("change").is_empty()
    })
    .await;
    assert!(host.tools("dropme").is_empty());
    assert!(
        !process_exists(drop_pid),
        "a removed server's process is reaped"
    );
    assert_ne!(change.pid(), Some(change_pid), "a changed server restarts");
    assert!(
        !host
            .tools("change")
            .contains(&"change__exit_now".to_string())
    );
    assert_eq!(
        keep.pid(),
        Some(keep_pid),
        "an unchanged server keeps its process"
    );
    assert_eq!(keep.starts(), 1);
    host.supervisor.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_swap_under_continuous_calls_fails_no_call_and_keeps_breaker_state() {
    // A long cooldown: the breaker must still be open after the swaps.
    let host = Host::start(r#"{"breaker": {"open_ms": 600000, "open_max_ms": 600000}}"#);
    let (busy, broken) = (host.state_dir("busy"), host.state_dir("broken"));
    host.supervisor
        .add_server(stdio_fixture("busy", &busy, &[]))
        .unwrap();
    let mut broken_spec = stdio_fixture("broken", &broken, &[]);
    broken_spec.timeouts.call = std::time::Duration::from_millis(100);
    host.supervisor.add_server(broken_spec).unwrap();
    for name in ["busy", "broken"] {
        wait_until("tools visible", || !host.tools(name).is_empty()).await;
    }
    // Open the breaker of one server with three timeouts.
    for _ in 0..3 {
        host.supervisor
            .call_tool("broken__slow", args(json!({"ms": 400})))
            .await
            .unwrap();
    }
    let breaker = |status: Vec<tether::policy::ServerStatus>| {
        status
            .into_iter()
            .find(|s| s.server == "broken")
            .map(|s| s.breaker)
    };
    assert_eq!(
        breaker(host.supervisor.policy_status().await),
        Some(BreakerState::Open)
    );

    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let callers: Vec<_> = (0..4)
        .map(|worker| {
            let (supervisor, stop, done, failed) = (
                host.supervisor.clone(),
                stop.clone(),
                done.clone(),
                failed.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let text = format!("w{worker}");
                    let result = supervisor
                        .call_tool("busy__echo", args(json!({"text": text})))
                        .await
                        .unwrap();
                    if is_error(&result) || common::text(&result) != text {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let wrong = PolicySource::File(tether_tests::components::WRONG.into());
    for round in 0..6 {
        let target = if round % 2 == 0 {
            wrong.clone()
        } else {
            PolicySource::Embedded
        };
        let before = done.load(Ordering::Relaxed);
        host.supervisor.policy().swap(target).await.expect("swap");
        wait_until("calls keep flowing", || {
            done.load(Ordering::Relaxed) > before + 10
        })
        .await;
    }
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await.unwrap();
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "of {} calls",
        done.load(Ordering::Relaxed)
    );
    assert!(done.load(Ordering::Relaxed) > 60);
    assert_eq!(
        breaker(host.supervisor.policy_status().await),
        Some(BreakerState::Open),
        "breaker state survives swaps"
    );
    assert_eq!(
        host.supervisor
            .policy()
            .stats()
            .swaps
            .load(Ordering::Relaxed),
        6
    );
    host.supervisor.shutdown().await;
}
