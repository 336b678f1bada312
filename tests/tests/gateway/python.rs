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
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The SDK says so when Tether answers its DELETE with a status it takes as a failure.
    assert!(!stderr.contains("Session termination failed"), "{stderr}");
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

/// What servers ask of a client reaches it through Tether, from servers of either generation
/// and for clients of either generation, and its answers go back: the official SDKs (1.x on
/// 2025-11-25, 2.x on 2026-07-28) answer a sampling and an elicitation of the conformance
/// fixture, which asks with a request to the client on 2025-11-25 (`legacy`, pinned) and with
/// a request for input on 2026-07-28 (`modern`). Tether relays each way across: an older
/// client is asked the old way what a 2026-07-28 server needs, and a 2026-07-28 client gets
/// an older server's request as a request for input, the server's call waiting meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_python_sdk_clients_answer_what_servers_of_both_generations_ask() {
    let dir = tempfile::tempdir().unwrap();
    let fixture =
        crate::conformance_suite::ConformanceFixture::start(&dir.path().join("fixture.log")).await;
    let config = json!({"mcpServers": {
        "modern": {"url": fixture.url, "type": "http"},
        "legacy": {"url": fixture.url, "type": "http", "protocol": "2025-11-25"},
    }});
    let config_path = dir.path().join("servers.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let (tether, url) = serve_http(dir.path(), &config_path).await;
    for (version, constraints, protocol) in SDKS {
        let python = tokio::task::spawn_blocking(move || sdk_python(version, constraints))
            .await
            .unwrap();
        let stdio = [
            "stdio",
            env!("CARGO_BIN_EXE_tether-cli"),
            "serve",
            "--config",
            config_path.to_str().unwrap(),
            "--state-file",
            dir.path()
                .join(format!("ask-{version}.json"))
                .to_str()
                .unwrap(),
            "--log-dir",
            dir.path().join("logs").to_str().unwrap(),
        ]
        .map(String::from);
        let over_http = ["ask".into(), "http".into(), url.clone()];
        let over_stdio: Vec<String> = std::iter::once("ask".to_string()).chain(stdio).collect();
        for target in [&over_http[..], &over_stdio[..]] {
            let report = run_agent(&python, target).await;
            let context = || format!("SDK {version} via {}: {report}", target[1]);
            assert!(report.get("failure").is_none(), "{}", context());
            assert_eq!(report["protocol"], protocol, "{}", context());
            for server in ["modern", "legacy"] {
                let sampled = report["answers"][format!("{server}__test_sampling")]
                    .as_str()
                    .unwrap_or_default();
                assert_eq!(
                    sampled,
                    "LLM response: sampled for the capital of France",
                    "{}",
                    context()
                );
                let elicited = report["answers"][format!("{server}__test_elicitation")]
                    .as_str()
                    .unwrap_or_default();
                assert!(
                    elicited.starts_with("User response: action=accept")
                        && elicited.contains("ada@example.com"),
                    "{}",
                    context()
                );
            }
            // Each server asked once per call, and the client saw exactly what it asked.
            assert_eq!(
                report["asked"]["sampling"],
                json!(["the capital of France", "the capital of France"]),
                "{}",
                context()
            );
            assert_eq!(
                report["asked"]["elicitation"],
                json!(["who are you?", "who are you?"]),
                "{}",
                context()
            );
        }
    }
    assert!(terminate(tether).await.success());
}
