//! The gateway under test: the real `tether serve --http` binary, its admin API through the real
//! CLI (`tether status --json`, `tether reconnect`), its memory from /proc, its shutdown.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

pub struct Gateway {
    child: Child,
    pub pid: u32,
    /// The MCP endpoint, `http://127.0.0.1:PORT/mcp`.
    pub url: String,
    pub admin: Admin,
}

/// The gateway's admin API, through the real CLI.
#[derive(Clone)]
pub struct Admin {
    tether: PathBuf,
    state_file: PathBuf,
}

/// One server's row of `tether status --json`.
#[derive(Debug, Clone)]
pub struct ServerStatus {
    pub name: String,
    pub state: String,
    pub pid: Option<u32>,
    pub tools: u64,
}

impl ServerStatus {
    /// Whether the host holds a live session (the states in which tools may be published).
    pub fn live(&self) -> bool {
        self.state == "connected" || self.state == "healthy"
    }
}

impl Gateway {
    /// Starts `tether serve --http 127.0.0.1:0` on `config`; its log goes to `dir/serve.log`.
    pub async fn start(
        tether: &Path,
        dir: &Path,
        config: &Path,
        policy_settings: &str,
    ) -> anyhow::Result<Gateway> {
        let state_file = dir.join("state.json");
        let mut child = Command::new(tether)
            .arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--http", "127.0.0.1:0"])
            .arg("--state-file")
            .arg(&state_file)
            .arg("--log-dir")
            .arg(dir.join("logs"))
            .args(["--policy-settings", policy_settings])
            .env("RUST_LOG", "tether=info")
            .env_remove("TETHER_ADMIN_TOKEN")
            .env_remove("TETHER_MCP_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().expect("just started");
        let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
        let mut log = tokio::fs::File::create(dir.join("serve.log")).await?;
        let found = tokio::time::timeout(Duration::from_secs(60), async {
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = log.write_all(format!("{line}\n").as_bytes()).await;
                if let Some(rest) = line.split("serving MCP at ").nth(1) {
                    return rest.split_whitespace().next().map(str::to_string);
                }
            }
            None
        })
        .await;
        let Ok(Some(url)) = found else {
            let _ = child.kill().await;
            anyhow::bail!(
                "tether serve did not announce its MCP address; see {}",
                dir.join("serve.log").display()
            );
        };
        // The rest of the log goes to the file too, so the gateway never blocks on stderr.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = log.write_all(format!("{line}\n").as_bytes()).await;
            }
            let _ = log.flush().await;
        });
        Ok(Gateway {
            child,
            pid,
            url,
            admin: Admin {
                tether: tether.to_path_buf(),
                state_file,
            },
        })
    }

    /// (VmRSS, VmHWM) in KiB.
    pub fn memory(&self) -> Option<(u64, u64)> {
        memory(self.pid)
    }

    /// Open file descriptors of the gateway.
    pub fn open_fds(&self) -> Option<usize> {
        Some(
            std::fs::read_dir(format!("/proc/{}/fd", self.pid))
                .ok()?
                .count(),
        )
    }

    /// SIGTERM, then waits up to `within` for the exit (SIGKILL after that). Returns the exit
    /// code (None: killed by a signal), how long it took, and whether it exited by itself.
    pub async fn terminate(mut self, within: Duration) -> (Option<i32>, Duration, bool) {
        let start = Instant::now();
        super::fleet::signal(self.pid, libc::SIGTERM);
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(Ok(status)) => (status.code(), start.elapsed(), true),
            _ => {
                let _ = self.child.kill().await;
                (None, start.elapsed(), false)
            }
        }
    }
}

/// (VmRSS, VmHWM) of a process in KiB.
pub fn memory(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse::<u64>()
            .ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

impl Admin {
    fn cli(&self) -> Command {
        let mut command = Command::new(&self.tether);
        command
            .env_remove("TETHER_ADMIN_TOKEN")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        command
    }

    /// Every server's status, from `tether status --json`.
    pub async fn status(&self) -> anyhow::Result<Vec<ServerStatus>> {
        let output = tokio::time::timeout(
            Duration::from_secs(15),
            self.cli()
                .arg("status")
                .arg("--json")
                .arg("--state-file")
                .arg(&self.state_file)
                .output(),
        )
        .await
        .map_err(|_| anyhow::anyhow!("tether status took over 15 s"))??;
        anyhow::ensure!(
            output.status.success(),
            "tether status failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&output.stdout)?;
        let servers = json
            .get("servers")
            .and_then(|s| s.as_array())
            .ok_or_else(|| anyhow::anyhow!("tether status --json has no `servers`"))?;
        Ok(servers
            .iter()
            .map(|s| ServerStatus {
                name: s["name"].as_str().unwrap_or_default().to_string(),
                state: s["state"].as_str().unwrap_or_default().to_string(),
                pid: s["pid"].as_u64().map(|p| p as u32),
                tools: s["tools"].as_u64().unwrap_or(0),
            })
            .collect())
    }

    /// `tether reconnect NAME`, as an operator would; true when the gateway accepted it.
    pub async fn reconnect(&self, server: &str) -> bool {
        let status = tokio::time::timeout(
            Duration::from_secs(15),
            self.cli()
                .arg("reconnect")
                .arg(server)
                .arg("--state-file")
                .arg(&self.state_file)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status(),
        )
        .await;
        matches!(status, Ok(Ok(status)) if status.success())
    }
}
