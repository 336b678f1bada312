//! Secrets stay where they belong: one in the host's environment never reaches a child
//! (configured env does), and the per-server logs are private and never hold the arguments.
//! (Each test runs in a process of its own, started with the secret in its environment: setting
//! it here would race the other tests' process spawns.)

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common::*;
use serde_json::json;

/// A secret in the host's environment.
const HOST_SECRET: (&str, &str) = ("TETHER_TEST_HOST_SECRET", "hunter2");

/// Whether this process runs the test `name` itself, with the host secret in its environment
/// (see [`in_own_process_with`]).
fn with_host_secret(name: &str) -> bool {
    let mine = in_own_process_with(name, &[HOST_SECRET]);
    if mine {
        assert_eq!(std::env::var(HOST_SECRET.0).as_deref(), Ok(HOST_SECRET.1));
    }
    mine
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_secrets_never_reach_a_child_but_configured_env_does() {
    if !with_host_secret("child_env::host_secrets_never_reach_a_child_but_configured_env_does") {
        return;
    }
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

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_logs_are_private_and_never_hold_the_arguments() {
    if !with_host_secret("child_env::server_logs_are_private_and_never_hold_the_arguments") {
        return;
    }
    let host = Host::fast();
    let state = host.state_dir("private");
    // Unknown tool names are ignored, so the fixture takes the secret without a word.
    let secret = "sk-live-0123456789abcdef";
    let tools = format!("--tools=echo,{secret}");
    host.supervisor
        .add_server(stdio_fixture("private", &state, &[&tools]))
        .unwrap();
    wait_until("tools visible", || !host.tools("private").is_empty()).await;
    let logs = host.dir.path().join("logs");
    let log = logs.join("private.log");
    assert_eq!(mode(&logs), 0o700, "a new log dir is private");
    assert_eq!(mode(&log), 0o600, "a new log file is private");

    // Modes an older run left looser are tightened at the next start.
    set_mode(&logs, 0o755);
    set_mode(&log, 0o644);
    kill(state.pid().unwrap(), 9);
    wait_until("the server restarted", || {
        state.starts() == 2 && !host.tools("private").is_empty()
    })
    .await;
    assert_eq!(mode(&logs), 0o700);
    assert_eq!(mode(&log), 0o600);

    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches("tether starting private").count(), 2, "{text}");
    assert!(text.contains("mcp-fixture with 5 args"), "{text}");
    assert!(!text.contains(secret), "{text}");
    assert!(
        !text.contains(state.path_str()),
        "no expanded argument: {text}"
    );
    host.supervisor.shutdown().await;
}
