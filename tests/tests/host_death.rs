//! Children die with the host, even when the host is SIGKILLed and cannot clean up, and so do
//! their own children: on Linux a guard process leads each server's process group and takes the
//! whole group down when the host dies. The host still sees the server's own exit.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::common::*;
use tether::transport::{SessionEnd, stdio};

/// Starts the host harness supervising one fixture with `flags`; answers the harness and the
/// fixture's pid once its tools are visible.
fn start_harness(dir: &Path, flags: &[&str]) -> (Child, u32) {
    let mut host = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .args([
            FIXTURE,
            dir.join("state").to_str().unwrap(),
            dir.join("logs").to_str().unwrap(),
        ])
        .args(flags)
        .stdout(Stdio::piped())
        .spawn()
        .expect("harness starts");
    let mut line = String::new();
    BufReader::new(host.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let child = line
        .trim()
        .strip_prefix("ready ")
        .expect("ready line")
        .parse()
        .unwrap();
    (host, child)
}

/// Field `index` (0: state, 1: ppid, 2: pgrp) of /proc/PID/stat, after the command name.
fn stat_field(pid: u32, index: usize) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit(')').next().unwrap();
    rest.split_whitespace().nth(index).unwrap().parse().unwrap()
}

/// The server's guard: its parent, outside its process group.
fn guard_of(server: u32) -> u32 {
    let guard = stat_field(server, 1);
    assert_ne!(
        stat_field(guard, 2),
        server,
        "the guard is outside the group"
    );
    guard
}

fn process_group(pid: u32) -> u32 {
    stat_field(pid, 2)
}

/// The pid of the `--spawn-grandchild` process of the fixture with state dir `state`.
fn grandchild(state: &Path) -> u32 {
    std::fs::read_to_string(state.join("grandchild.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn children_die_with_a_killed_host() {
    let dir = tempfile::tempdir().unwrap();
    let (mut host, child) = start_harness(dir.path(), &[]);
    assert!(process_alive(child));
    host.kill().unwrap(); // SIGKILL: no cleanup code runs in the host
    host.wait().unwrap();
    wait_until("the orphaned child is gone", || !process_alive(child)).await;
}

#[tokio::test]
async fn grandchildren_die_with_a_killed_host() {
    let dir = tempfile::tempdir().unwrap();
    let (mut host, child) = start_harness(dir.path(), &["--spawn-grandchild"]);
    let grandchild = grandchild(&dir.path().join("state"));
    let guard = guard_of(child);
    assert_eq!(process_group(child), child, "the server leads its group");
    assert_eq!(process_group(grandchild), child);
    for pid in [guard, child, grandchild] {
        assert!(process_alive(pid), "{pid} runs");
    }
    host.kill().unwrap(); // SIGKILL: no cleanup code runs in the host
    host.wait().unwrap();
    for (what, pid) in [
        ("guard", guard),
        ("child", child),
        ("grandchild", grandchild),
    ] {
        wait_until(&format!("the orphaned {what} {pid} is gone"), || {
            !process_alive(pid)
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_leaves_no_grandchild() {
    let host = Host::fast();
    let mut family = Vec::new();
    // A server that exits when its stdin closes, one that takes SIGKILL, one left for shutdown.
    let servers: [(&str, &[&str]); 3] = [
        ("removed", &["--spawn-grandchild"]),
        ("stubborn", &["--spawn-grandchild", "--stubborn"]),
        ("shut-down", &["--spawn-grandchild"]),
    ];
    for (name, flags) in servers {
        let state = host.state_dir(name);
        host.supervisor
            .add_server(stdio_fixture(name, &state, flags))
            .unwrap();
        wait_until("tools visible", || !host.tools(name).is_empty()).await;
        family.push((state.pid().unwrap(), grandchild(&state.0)));
    }
    let [first, second, (kept, kept_grandchild)] = family[..] else {
        unreachable!()
    };

    for ((server, grandchild), name) in [(first, "removed"), (second, "stubborn")] {
        assert!(host.supervisor.remove_server(name).await);
        assert!(!process_exists(server), "{name}: the server is reaped");
        wait_until(&format!("{name}: the grandchild is gone"), || {
            !process_alive(grandchild)
        })
        .await;
    }
    assert!(process_alive(kept) && process_alive(kept_grandchild));

    host.supervisor.shutdown().await;
    assert!(!process_exists(kept), "the server is reaped");
    wait_until("the shut down server's grandchild is gone", || {
        !process_alive(kept_grandchild)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_sees_the_server_exit_as_it_was_through_the_guard() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir(dir.path().join("state"));
    let logs = dir.path().join("logs");
    let spawn = |flags: &[&str]| {
        let mut args = vec!["--transport", "stdio", "--state-dir", state.path_str()];
        args.extend_from_slice(flags);
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        spawn_child("exits", &args, &logs)
    };

    // An exit code passes through unchanged.
    let (process, _stdout, _stdin) = spawn(&["--crash-at-startup", "9"]);
    assert_eq!(process.wait_exit(PATIENCE).await, Some(Some(9)));

    // kill -9 of the reported pid (the server's own) reads as killed, and nothing is left.
    let (process, _stdout, _stdin) = spawn(&[]);
    let server = process.pid();
    wait_until("the server runs", || state.pid() == Some(server)).await;
    let guard = guard_of(server);
    kill(server, 9);
    assert_eq!(process.wait_exit(PATIENCE).await, Some(None));
    assert!(!process_exists(server), "the guard reaped the server");
    wait_until("the host reaped the guard", || !process_exists(guard)).await;

    // A SIGKILLed guard takes its server along (the server's death signal), and the host then
    // kills what the server left in its group.
    let grandchild_file = state.0.join("grandchild.pid");
    let (process, _stdout, _stdin) = spawn(&["--spawn-grandchild"]);
    let server = process.pid();
    wait_until("the grandchild runs", || grandchild_file.exists()).await;
    let first_grandchild = grandchild(&state.0);
    kill(guard_of(server), 9);
    assert_eq!(process.wait_exit(PATIENCE).await, Some(None));
    wait_until("the server died with its guard", || !process_alive(server)).await;
    wait_until("its child too", || !process_alive(first_grandchild)).await;
    std::fs::remove_file(&grandchild_file).unwrap();

    // SIGTERM sent to the guard reaches the server's whole group; the server died of it.
    let (process, _stdout, _stdin) = spawn(&["--spawn-grandchild"]);
    let server = process.pid();
    wait_until("the grandchild runs", || grandchild_file.exists()).await;
    let grandchild = grandchild(&state.0);
    kill(guard_of(server), 15);
    assert_eq!(process.wait_exit(PATIENCE).await, Some(None));
    wait_until("the grandchild got the SIGTERM too", || {
        !process_alive(grandchild)
    })
    .await;
}

/// Tether as PID 1 (a container's entry point) inherits every orphan: nothing a server leaves
/// may come to it to become a zombie. A subreaper test process stands in for PID 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_a_server_leaves_becomes_a_zombie_of_the_host() {
    if !in_own_process("host_death::nothing_a_server_leaves_becomes_a_zombie_of_the_host") {
        return;
    }
    // SAFETY: prctl on this process only; orphans below it now come to it, as to PID 1.
    assert_eq!(
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong) },
        0
    );
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir(dir.path().join("state"));
    let args: Vec<String> = [
        "--transport",
        "stdio",
        "--state-dir",
        state.path_str(),
        "--spawn-grandchild",
        "--spawn-daemon",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let (process, _stdout, _stdin) = spawn_child("leaves", &args, &dir.path().join("logs"));
    let daemon_file = state.0.join("daemon.pid");
    wait_until("the daemon runs", || daemon_file.exists()).await;
    let (server, grandchild) = (process.pid(), grandchild(&state.0));
    let daemon: u32 = std::fs::read_to_string(&daemon_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let guard = guard_of(server);
    assert_ne!(process_group(daemon), server, "the daemon left the group");

    kill(server, 9);
    assert_eq!(process.wait_exit(PATIENCE).await, Some(None));
    // The group was killed with its leader, and reaped: not even a zombie is left.
    wait_until("the grandchild is gone", || !process_exists(grandchild)).await;
    // What left the group lives on, as without Tether, in the guard's care.
    assert!(process_alive(daemon), "the daemon lives on");
    assert_eq!(stat_field(daemon, 1), guard, "the guard adopted the daemon");
    assert!(
        process_alive(guard),
        "the guard stays while the daemon runs"
    );

    kill(daemon, 9);
    wait_until("the daemon is reaped", || !process_exists(daemon)).await;
    wait_until("the guard ends with nothing left", || {
        !process_exists(guard)
    })
    .await;
}

/// A command that cannot run fails its spawn at once, every time, however early the server's
/// end comes for its guard (a SIGCHLD lost before the guard waited once hung the spawn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_cannot_run_fails_its_spawn_at_once_every_time() {
    let dir = tempfile::tempdir().unwrap();
    // Four at once, so guards are slowed down the way a loaded machine slows them.
    let attempts = (0..4).map(|_| {
        let logs = dir.path().join("logs");
        tokio::task::spawn_blocking(move || {
            for _ in 0..200 {
                let child = stdio::Spawn {
                    server: "ghost",
                    command: "/nonexistent/mcp-server",
                    args: &[],
                    env: &BTreeMap::new(),
                    cwd: None,
                    log_dir: &logs,
                };
                assert!(stdio::spawn(&child, &SessionEnd::new()).is_err());
            }
        })
    });
    for attempt in tokio::time::timeout(PATIENCE, futures::future::join_all(attempts))
        .await
        .expect("every spawn fails at once")
    {
        attempt.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_outlives_the_host_thread_that_started_it() {
    // A death signal comes when the forking *thread* exits: only the host's death may count.
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir(dir.path().join("state"));
    let args: Vec<String> = ["--transport", "stdio", "--state-dir", state.path_str()]
        .into_iter()
        .map(String::from)
        .collect();
    let logs = dir.path().join("logs");
    let runtime = tokio::runtime::Handle::current();
    let (process, _stdout, stdin) = std::thread::spawn(move || {
        let _runtime = runtime.enter();
        spawn_child("orphan", &args, &logs)
    })
    .join()
    .unwrap();
    wait_until("the server runs", || state.pid() == Some(process.pid())).await;
    drop(stdin);
    assert_eq!(
        process.wait_exit(PATIENCE).await,
        Some(Some(0)),
        "the server ended on its own, at the end of its input"
    );
}

/// Private memory of a process, in bytes (what it holds that no other process shares).
fn private_bytes(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .filter(|line| line.starts_with("Private_"))
        .filter_map(|line| line.split_whitespace().nth(1)?.parse::<usize>().ok())
        .sum::<usize>()
        * 1024
}

/// A guard is a fork of the host: it must not keep a copy of the host's memory, or every
/// stdio server would cost as much as the host itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_does_not_keep_a_copy_of_the_host_memory() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir(dir.path().join("state"));
    // Memory the host has when the guard forks, and writes to afterwards: without care, every
    // page written becomes a private copy in the guard.
    let mut ballast = vec![1u8; 64 << 20];
    let args: Vec<String> = ["--transport", "stdio", "--state-dir", state.path_str()]
        .into_iter()
        .map(String::from)
        .collect();
    let (process, _stdout, _stdin) = spawn_child("small", &args, &dir.path().join("logs"));
    let server = process.pid();
    wait_until("the server runs", || state.pid() == Some(server)).await;
    for page in ballast.iter_mut().step_by(4096) {
        *page = 2;
    }
    let guard = guard_of(server);
    let private = private_bytes(guard);
    assert!(private > 0, "no smaps_rollup for the guard {guard}");
    assert!(
        private < 8 << 20,
        "the guard holds {} MiB of private memory",
        private >> 20
    );
    assert_eq!(ballast[4096], 2);
}

/// Starts the fixture as Tether starts a stdio server.
fn spawn_child(
    server: &str,
    args: &[String],
    logs: &Path,
) -> (
    stdio::ChildProcess,
    tokio::process::ChildStdout,
    tokio::process::ChildStdin,
) {
    let child = stdio::Spawn {
        server,
        command: FIXTURE,
        args,
        env: &BTreeMap::new(),
        cwd: None,
        log_dir: logs,
    };
    stdio::spawn(&child, &SessionEnd::new()).expect("spawns")
}
