//! The official Python MCP SDK as a real agent on the gateway: 2.x (negotiates 2026-07-28 by
//! default) and 1.x (2025-11-25), over Streamable HTTP and stdio. Each SDK is installed once,
//! pinned with its dependencies (`tests/python/constraints-*.txt`), into a virtualenv under
//! the target directory; `tests/python/agent.py` drives it and reports what it saw as JSON.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::*;

/// (SDK version, constraints file, the protocol its default client negotiates with Tether)
const SDKS: [(&str, &str, &str); 2] = [
    ("2.3.0", "constraints-2.txt", "2026-07-28"),
    ("1.30.0", "constraints-1.txt", "2025-11-25"),
];

fn python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python")
}

/// The virtualenv's python with `mcp==version` installed (on first use).
fn sdk_python(version: &str, constraints: &str) -> PathBuf {
    python_venv(
        &format!("mcp-{version}"),
        &format!("mcp=={version}"),
        constraints,
    )
    .join("bin")
    .join("python")
}

/// Runs the agent with `python` against `target` (`["http", URL]` or `["stdio", cmd...]`).
async fn run_agent(python: &Path, target: &[String]) -> Value {
    let output = tokio::time::timeout(
        PATIENCE * 3,
        tokio::process::Command::new(python)
            .arg(python_dir().join("agent.py"))
            .args(target)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the Python agent finishes in time")
    .expect("the Python agent runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "the agent printed no report:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn assert_full_use(report: &Value, protocol: &str) {
    let context = || report.to_string();
    assert!(report.get("failure").is_none(), "{}", context());
    assert_eq!(report["protocol"], protocol, "{}", context());
    assert!(
        report["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("up__echo")),
        "{}",
        context()
    );
    assert_eq!(report["echo"], "from python", "{}", context());
    assert_eq!(report["echo_is_error"], false);
    assert_eq!(report["slow"], "slept 450 ms");
    assert!(
        report["progress"].as_array().unwrap().len() >= 2,
        "progress reached the client: {}",
        context()
    );
    assert_eq!(report["prompts"], json!(["up__greet"]));
    assert_eq!(report["prompt"], "greet: hello, py!");
    assert_eq!(report["resources"], json!(["up://readme"]));
    assert_eq!(report["read"], "contents of up://readme");
    assert_eq!(report["completion"], json!(["carol"]));
    assert!(
        report["unknown_tool"]
            .as_str()
            .unwrap()
            .contains("not in tools/list"),
        "{}",
        context()
    );
}

/// One upstream `up` offering a prompt and a resource.
fn upstream_config(dir: &Path) -> PathBuf {
    let state = dir.join("up");
    std::fs::create_dir_all(&state).unwrap();
    let config = json!({"mcpServers": {"up": {"command": FIXTURE, "args": [
        "--transport", "stdio", "--state-dir", state.to_str().unwrap(),
        "--prompts", "greet", "--resources", "up://readme",
    ]}}});
    let path = dir.join("servers.json");
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_python_sdk_clients_of_both_generations_use_the_whole_surface() {
    let dir = tempfile::tempdir().unwrap();
    let config = upstream_config(dir.path());
    let (tether, url) = serve_http(dir.path(), &config).await;
    for (version, constraints, protocol) in SDKS {
        let python = tokio::task::spawn_blocking(move || sdk_python(version, constraints))
            .await
            .unwrap();
        // Streamable HTTP, on the gateway above.
        let report = run_agent(&python, &["http".into(), url.clone()]).await;
        assert_full_use(&report, protocol);
        // stdio: the SDK starts its own `tether serve` as a child.
        let state_file = dir.path().join(format!("state-{version}.json"));
        let stdio = [
            "stdio",
            env!("CARGO_BIN_EXE_tether-cli"),
            "serve",
            "--config",
            config.to_str().unwrap(),
            "--state-file",
            state_file.to_str().unwrap(),
            "--log-dir",
            dir.path().join("logs").to_str().unwrap(),
        ]
        .map(String::from);
        let report = run_agent(&python, &stdio).await;
        assert_full_use(&report, protocol);
    }
    assert!(terminate(tether).await.success());
}
