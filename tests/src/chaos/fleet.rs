//! The fixture servers under chaos: their state directories, `control.json`, the stdio children
//! Tether spawns (found through their `pid` files), and the HTTP/SSE fixtures this soak runs
//! itself, each behind a keeper task that kills and restarts it on the same port.

use crate::process_alive;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::rng::Rng;
use super::schedule::Transport;

/// The tools every fixture advertises in the soak: two that are not read-only (`side_effect`,
/// `echo`) and one that is (`add`).
pub const TOOLS: &str = "echo,add,side_effect";

/// One fixture server.
pub struct Server {
    pub name: String,
    pub transport: Transport,
    /// The fixture's state directory (`pid`, `starts`, `calls.log`, `control.json`).
    pub state: PathBuf,
    /// HTTP/SSE: the keeper of the fixture process.
    pub keeper: Option<Keeper>,
}

impl Server {
    /// Replaces `control.json` atomically (the fixture reads it on every call and initialize).
    pub fn control(&self, value: serde_json::Value) {
        let tmp = self.state.join("control.json.tmp");
        if std::fs::write(&tmp, value.to_string()).is_ok() {
            let _ = std::fs::rename(tmp, self.state.join("control.json"));
        }
    }

    /// Back to the fixture's flags.
    pub fn clear_control(&self) {
        let _ = std::fs::remove_file(self.state.join("control.json"));
    }

    /// The running fixture process of this server (from its `pid` file), if it lives.
    pub fn pid(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.state.join("pid"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let needle = self.state.to_str()?;
        (process_alive(pid) && cmdline(pid).is_some_and(|c| c.contains(needle))).then_some(pid)
    }

    /// SIGKILLs the server's process; an HTTP fixture is started again after `restart_after`.
    /// False when there was no process to kill.
    pub fn kill(&self, restart_after: Duration) -> bool {
        match &self.keeper {
            Some(keeper) => keeper.send(KeeperCommand::Kill { restart_after }),
            None => match self.pid() {
                Some(pid) => {
                    signal(pid, libc::SIGKILL);
                    true
                }
                None => false,
            },
        }
    }

    /// Process starts recorded in the state directory.
    pub fn starts(&self) -> u64 {
        std::fs::read_to_string(self.state.join("starts"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The executed calls: one `<tool> <arguments-json>` line each.
    pub fn calls_log(&self) -> String {
        std::fs::read_to_string(self.state.join("calls.log")).unwrap_or_default()
    }
}

pub fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a pid; no memory is involved.
    unsafe { libc::kill(pid as i32, signal) };
}

fn cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&raw).replace('\0', " "))
}

/// Live (non-zombie) processes whose command line contains `needle`, with that command line.
pub fn processes_naming(needle: &str) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<(u32, String)> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != std::process::id())
        .filter_map(|pid| Some((pid, cmdline(pid)?)))
        .filter(|(pid, cmd)| cmd.contains(needle) && process_alive(*pid))
        .collect();
    found.sort();
    found
}

/// How the soak starts a fixture.
#[derive(Clone)]
pub struct FixtureCommand {
    pub fixture: PathBuf,
    pub transport: Transport,
    pub state: PathBuf,
    /// The fixture's stderr, appended across restarts.
    pub log: PathBuf,
}

impl FixtureCommand {
    /// The arguments of a stdio fixture (for the gateway's config).
    pub fn stdio_args(state: &Path) -> Vec<String> {
        vec![
            "--transport".into(),
            "stdio".into(),
            "--state-dir".into(),
            state.display().to_string(),
            "--tools".into(),
            TOOLS.into(),
        ]
    }

    /// Starts an HTTP/SSE fixture on `bind` and waits for its `listening on` line.
    async fn start(&self, bind: SocketAddr) -> Result<(Child, SocketAddr), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("fixture log {}: {e}", self.log.display()))?;
        let mut child = Command::new(&self.fixture)
            .arg("--transport")
            .arg(self.transport.name())
            .arg("--bind")
            .arg(bind.to_string())
            .arg("--state-dir")
            .arg(&self.state)
            .args(["--tools", TOOLS])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", self.fixture.display()))?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let first = tokio::time::timeout(Duration::from_secs(15), lines.next_line()).await;
        let addr = match first {
            Ok(Ok(Some(line))) => line
                .strip_prefix("listening on ")
                .and_then(|a| a.trim().parse().ok()),
            _ => None,
        };
        match addr {
            Some(addr) => {
                // Nothing more comes on stdout; keep the pipe open and drained anyway.
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                Ok((child, addr))
            }
            None => {
                let _ = child.kill().await;
                Err(format!("the fixture did not start listening on {bind}"))
            }
        }
    }
}

pub enum KeeperCommand {
    Kill {
        restart_after: Duration,
    },
    /// Kill and stay down until `Up`.
    Down,
    Up,
    Stop(oneshot::Sender<KeeperStats>),
}

/// What a keeper did.
#[derive(Debug, Clone, Default)]
pub struct KeeperStats {
    pub starts: u64,
    pub kills: u64,
    /// Exits the soak did not cause (flap, crash mid-call).
    pub exits: u64,
    /// Restarts that could not listen on the port again (retried).
    pub failed_starts: u64,
}

/// Runs one HTTP/SSE fixture: restarts it on the same address after it exits or is killed,
/// unless it is held down.
pub struct Keeper {
    commands: mpsc::UnboundedSender<KeeperCommand>,
    pub addr: SocketAddr,
}

impl Keeper {
    /// Starts the fixture on a free port and keeps it. The port is below Linux's ephemeral
    /// range (32768 and up), so that while the fixture is down no outgoing connection of
    /// Tether's can take it as its local port and keep the fixture from listening again.
    pub async fn start(command: FixtureCommand, mut rng: Rng) -> Result<Keeper, String> {
        let mut failure = String::new();
        for _ in 0..20 {
            let port = 20_000 + rng.below(12_000) as u16;
            match command
                .start(SocketAddr::from(([127, 0, 0, 1], port)))
                .await
            {
                Ok((child, addr)) => {
                    let (commands, receiver) = mpsc::unbounded_channel();
                    tokio::spawn(keep(command, addr, child, receiver, rng));
                    return Ok(Keeper { commands, addr });
                }
                Err(error) => failure = error,
            }
        }
        Err(failure)
    }

    pub fn send(&self, command: KeeperCommand) -> bool {
        self.commands.send(command).is_ok()
    }

    /// Kills the fixture for good and returns what the keeper did.
    pub async fn stop(&self) -> KeeperStats {
        let (tx, rx) = oneshot::channel();
        if !self.send(KeeperCommand::Stop(tx)) {
            return KeeperStats::default();
        }
        rx.await.unwrap_or_default()
    }
}

async fn exited(child: &mut Option<Child>) {
    match child.as_mut() {
        Some(child) => {
            let _ = child.wait().await;
        }
        None => std::future::pending().await,
    }
}

async fn kill(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill().await;
    }
}

async fn keep(
    command: FixtureCommand,
    addr: SocketAddr,
    child: Child,
    mut commands: mpsc::UnboundedReceiver<KeeperCommand>,
    mut rng: Rng,
) {
    let mut stats = KeeperStats {
        starts: 1,
        ..KeeperStats::default()
    };
    let mut child = Some(child);
    let mut held_down = false;
    let mut restart_at: Option<Instant> = None;
    loop {
        let (due, held) = (restart_at, held_down);
        let restart_due = async move {
            match due {
                Some(at) if !held => tokio::time::sleep_until(at).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            command = commands.recv() => match command {
                Some(KeeperCommand::Kill { restart_after }) => {
                    if child.is_some() {
                        stats.kills += 1;
                        kill(&mut child).await;
                    }
                    restart_at = Some(Instant::now() + restart_after);
                }
                Some(KeeperCommand::Down) => {
                    if child.is_some() {
                        stats.kills += 1;
                        kill(&mut child).await;
                    }
                    held_down = true;
                }
                Some(KeeperCommand::Up) => {
                    held_down = false;
                    if child.is_none() {
                        restart_at = Some(Instant::now());
                    }
                }
                Some(KeeperCommand::Stop(done)) => {
                    kill(&mut child).await;
                    let _ = done.send(stats);
                    return;
                }
                None => {
                    kill(&mut child).await;
                    return;
                }
            },
            () = exited(&mut child) => {
                child = None;
                stats.exits += 1;
                restart_at = Some(Instant::now() + rng.millis(50, 600));
            }
            () = restart_due => {
                restart_at = None;
                match command.start(addr).await {
                    Ok((started, _)) => {
                        stats.starts += 1;
                        child = Some(started);
                    }
                    Err(_) => {
                        stats.failed_starts += 1;
                        restart_at = Some(Instant::now() + Duration::from_millis(200));
                    }
                }
            }
        }
    }
}
