//! The admin API as its OpenAPI document says: schemathesis (from PyPI, every version pinned)
//! generates requests from `docs/admin-openapi.json`, sends them to a running gateway, and
//! checks every answer's status, content type and schema against the document.

use super::*;

const SCHEMATHESIS: &str = "schemathesis==4.32.5";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_answers_as_its_openapi_document_says() {
    let venv = python_venv(
        "schemathesis-4.32.5",
        SCHEMATHESIS,
        "constraints-schemathesis.txt",
    );
    let (dir, _state, config) = one_upstream();
    let gateway = start_http(serve_command(
        dir.path(),
        &config,
        &["--http", "127.0.0.1:0"],
    ))
    .await;
    let state = tether_cli::state_file::read(&dir.path().join("state.json")).unwrap();
    let document = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/admin-openapi.json");
    let output = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new(venv.join("bin").join("st"))
            .arg("run")
            .arg(&document)
            .arg("--url")
            .arg(format!("http://{}", state.addr))
            .arg("-H")
            .arg(format!("Authorization: Bearer {}", state.token))
            .args([
                "--max-examples",
                "10",
                "--seed",
                "1",
                "--request-timeout",
                "5",
            ])
            // Settings the policy refuses (unknown keys) are valid JSON objects, which is all
            // the document can say of them: their 422 is right.
            .args(["--exclude-checks", "positive_data_acceptance"])
            .env("NO_COLOR", "1")
            // Its cache (.schemathesis/) goes into the test's own directory, not the tree.
            .current_dir(dir.path())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("schemathesis finishes")
    .expect("schemathesis runs");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the admin API differs from docs/admin-openapi.json:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(report.contains("Tested: 13"), "{report}");
    assert!(terminate(gateway.tether).await.success());
}
