//! A secret in the host's environment never reaches a child; configured env does. (Its own test
//! binary: it sets the host environment, which must not race other tests' process spawns.)

mod common;

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_secrets_never_reach_a_child_but_configured_env_does() {
    // SAFETY: this binary's only test; set before any thread spawns a process.
    unsafe { std::env::set_var("TETHER_TEST_HOST_SECRET", "hunter2") };
    let host = Host::fast();
    let state = host.state_dir("envy");
    let spec = with_env(
        stdio_fixture("envy", &state, &["--print-env"]),
        "CONFIGURED_TOKEN",
        "given-on-purpose",
    );
    host.supervisor.add_server(spec).unwrap();
    wait_until("tools visible", || {
        host.tools("envy").contains(&"envy__env".to_string())
    })
    .await;
    let result = host
        .supervisor
        .call_tool("envy__env", args(json!({})))
        .await
        .unwrap();
    let env = text(&result);
    assert!(!env.contains("hunter2"), "{env}");
    assert!(!env.contains("TETHER_TEST_HOST_SECRET"), "{env}");
    assert!(env.contains("given-on-purpose"), "{env}");
    assert!(env.contains("PATH"), "allowlisted variables pass: {env}");
    host.supervisor.shutdown().await;
}
