//! The dashboard (`/ui` on the admin listener) in a real browser: Debian's Chromium driven by
//! selenium (tests/python/dashboard_ui.py). The page loads with the token, shows a server that
//! the test kills turning from healthy to backing off and back, and swaps the policy from its
//! own form. Screenshots of each step are written to a directory the output names.

use std::path::{Path, PathBuf};

use super::*;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Debian's chromium and chromium-driver: installed on first use when this runs as root (as on
/// a fresh CI machine), else the test says how to install them.
fn browser() {
    if Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists() {
        return;
    }
    let lock_path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("apt-chromium.lock");
    let lock = std::fs::File::create(&lock_path).unwrap();
    lock.lock().expect("locking the browser install");
    if Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists() {
        return;
    }
    assert!(
        unsafe { libc::geteuid() } == 0,
        "the dashboard test needs Debian's Chromium: `sudo apt-get install chromium chromium-driver`"
    );
    let apt = |args: &[&str]| {
        std::process::Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .expect("apt-get runs")
    };
    let mut installed = apt(&["install", "-y", "-q", "chromium", "chromium-driver"]);
    if !installed.status.success() {
        // A fresh machine may have no package lists yet.
        apt(&["update", "-q"]);
        installed = apt(&["install", "-y", "-q", "chromium", "chromium-driver"]);
    }
    assert!(
        installed.status.success(),
        "apt-get install chromium chromium-driver failed:\n{}",
        String::from_utf8_lossy(&installed.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_follows_a_killed_server_back_to_healthy_and_swaps_the_policy() {
    browser();
    let venv = python_venv("selenium", "selenium", "constraints-selenium.txt");

    let dir = tempfile::tempdir().unwrap();
    let state = StateDir(dir.path().join("up"));
    std::fs::create_dir_all(&state.0).unwrap();
    let config = dir.path().join("servers.json");
    // A backoff long enough for the page to show it, short enough for the test.
    let servers = json!({"mcpServers": {"up": {
        "command": FIXTURE,
        "args": ["--transport", "stdio", "--state-dir", state.path_str()],
        "policy": {"backoff": {"base_ms": 1500, "cap_ms": 3000, "jitter": "none"}},
    }}});
    std::fs::write(&config, servers.to_string()).unwrap();
    let (tether, _url) = serve_http(dir.path(), &config).await;
    // What an operator runs to open it: the address with the token in the fragment.
    let printed = Command::new(env!("CARGO_BIN_EXE_tether-cli"))
        .args(["dashboard", "--state-file"])
        .arg(dir.path().join("state.json"))
        .env_remove("TETHER_ADMIN_TOKEN")
        .output()
        .await
        .unwrap();
    let link = String::from_utf8_lossy(&printed.stdout).trim().to_string();
    let (page, token) = link
        .split_once("#token=")
        .unwrap_or_else(|| panic!("tether dashboard printed {link:?}"));
    assert!(
        page.starts_with("http://127.0.0.1:") && page.ends_with("/ui"),
        "{link}"
    );

    let shots: PathBuf = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("dashboard-screenshots")
        .join(format!("{}", std::process::id()));
    std::fs::create_dir_all(&shots).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("python")
        .join("dashboard_ui.py");
    let output = Command::new(venv.join("bin").join("python"))
        .arg(script)
        .args(["--url", page, "--server", "up"])
        .args(["--policy", tether_tests::components::OTHER])
        .args(["--chromium", CHROMIUM, "--chromedriver", CHROMEDRIVER])
        .arg("--screenshots")
        .arg(&shots)
        .env("TETHER_ADMIN_TOKEN", token)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("the browser test runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}\nscreenshots: {}", shots.display());
    assert!(
        output.status.success() && stdout.contains("dashboard ok"),
        "the dashboard test failed (screenshots in {}):\n{stdout}\n{stderr}",
        shots.display()
    );
    for step in ["1-healthy", "2-backing-off", "3-healthy-again", "4-swapped"] {
        let shot = shots.join(format!("{step}.png"));
        let bytes = std::fs::read(&shot).unwrap_or_default();
        assert!(
            bytes.starts_with(b"\x89PNG"),
            "no screenshot {}",
            shot.display()
        );
    }
    assert!(terminate(tether).await.success());
}
