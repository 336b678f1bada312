//! Upstream servers as child processes speaking MCP on stdin/stdout.
//!
//! Every child gets its own process group (so grandchildren die with it), a minimal environment
//! (an allowlist of the host's plus what the config sets: host secrets never leak), its stderr
//! appended to a per-server log file, and a death signal tied to the host. A reaper task owns the
//! `Child` and publishes its exit status, so no child is ever left a zombie.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{ChildStdin, ChildStdout, Command};
use tokio::sync::watch;

use super::Fault;

/// Host environment variables a child inherits; everything else must be configured explicitly.
const ENV_ALLOWLIST: &[&str] = &[
    "PATH", "HOME", "USER", "LANG", "LC_ALL", "TERM", "SHELL", "TMPDIR",
];

/// A running (or exited, not yet forgotten) child process.
#[derive(Debug)]
pub struct ChildProcess {
    pid: u32,
    exit: watch::Receiver<Option<Option<i32>>>,
}

impl ChildProcess {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `Some(code)` once the process has exited (`code` is `None` when a signal killed it).
    pub fn exit_status(&self) -> Option<Option<i32>> {
        *self.exit.borrow()
    }

    pub fn is_alive(&self) -> bool {
        self.exit_status().is_none()
    }

    /// Waits up to `within` for the process to exit; returns its status if it did.
    pub async fn wait_exit(&self, within: Duration) -> Option<Option<i32>> {
        let mut exit = self.exit.clone();
        tokio::time::timeout(within, exit.wait_for(Option::is_some))
            .await
            .ok()
            .and_then(|status| status.ok().and_then(|s| *s))
    }

    /// Stops the process group: the caller has already closed stdin; wait `grace`, then SIGTERM,
    /// wait `grace`, then SIGKILL. Returns once the leader is reaped.
    pub async fn terminate(&self, grace: Duration) {
        if self.wait_exit(grace).await.is_none() {
            signal_group(self.pid, libc::SIGTERM);
            if self.wait_exit(grace).await.is_none() {
                signal_group(self.pid, libc::SIGKILL);
                let _ = self.wait_exit(Duration::from_secs(5)).await;
            }
        }
        // The leader is gone; take any processes it left in its group with it.
        signal_group(self.pid, libc::SIGKILL);
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if self.is_alive() {
            // Dropped without terminate(): kill hard; the reaper task still reaps it.
            signal_group(self.pid, libc::SIGKILL);
        }
    }
}

fn signal_group(pid: u32, signal: libc::c_int) {
    if let Ok(pgid) = libc::pid_t::try_from(pid) {
        // SAFETY: killpg only sends a signal; the group is the child's own (process_group(0)).
        unsafe {
            libc::killpg(pgid, signal);
        }
    }
}

/// Starts `command` for `server`; returns the process and its stdio pipes.
pub fn spawn(
    server: &str,
    command: &str,
    args: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&Path>,
    log_dir: &Path,
) -> Result<(ChildProcess, ChildStdout, ChildStdin), Fault> {
    if let Some(dir) = cwd
        && !dir.is_dir()
    {
        return Err(Fault::SpawnFailed(format!(
            "working directory {} does not exist",
            dir.display()
        )));
    }
    let stderr = open_log(server, command, args, log_dir).map_err(|e| {
        Fault::SpawnFailed(format!(
            "cannot open the log file in {}: {e}",
            log_dir.display()
        ))
    })?;
    let mut cmd = Command::new(command);
    cmd.args(args)
        .env_clear()
        .envs(allowed_host_env())
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .process_group(0)
        .kill_on_drop(false);
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let host_pid = std::process::id();
    // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // Die with the host even if it is SIGKILLed.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() as u32 != host_pid {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| spawn_fault(command, &e))?;
    let pid = child.id().unwrap_or_default();
    let stdin = child.stdin.take().expect("stdin is piped");
    let stdout = child.stdout.take().expect("stdout is piped");
    let (exit_tx, exit_rx) = watch::channel(None);
    tokio::spawn(async move {
        // `code()` is None when a signal ended the process.
        let code = child.wait().await.ok().and_then(|status| status.code());
        let _ = exit_tx.send(Some(code));
    });
    Ok((ChildProcess { pid, exit: exit_rx }, stdout, stdin))
}

fn spawn_fault(command: &str, error: &std::io::Error) -> Fault {
    Fault::SpawnFailed(match error.kind() {
        std::io::ErrorKind::NotFound => format!("command not found: {command}"),
        std::io::ErrorKind::PermissionDenied => format!("permission denied: {command}"),
        _ => format!("cannot start {command}: {error}"),
    })
}

fn allowed_host_env() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(key, _)| ENV_ALLOWLIST.contains(&key.as_str()) || key.starts_with("XDG_"))
        .collect()
}

/// The server's stderr log, with a header marking this start.
pub fn log_path(log_dir: &Path, server: &str) -> PathBuf {
    log_dir.join(format!("{server}.log"))
}

fn open_log(
    server: &str,
    command: &str,
    args: &[String],
    log_dir: &Path,
) -> std::io::Result<std::fs::File> {
    std::fs::create_dir_all(log_dir)?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path(log_dir, server))?;
    writeln!(
        file,
        "=== {} tether starting {server}: {command} {} ===",
        humantime::format_rfc3339_seconds(std::time::SystemTime::now()),
        args.join(" ")
    )?;
    Ok(file)
}
