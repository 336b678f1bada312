//! Children die with the host, even when the host is SIGKILLed and cannot clean up.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::*;

#[tokio::test]
async fn children_die_with_a_killed_host() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .args([
            FIXTURE,
            dir.path().join("state").to_str().unwrap(),
            dir.path().join("logs").to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("harness starts");
    let mut line = String::new();
    BufReader::new(host.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let child: u32 = line
        .trim()
        .strip_prefix("ready ")
        .expect("ready line")
        .parse()
        .unwrap();
    assert!(process_alive(child));
    host.kill().unwrap(); // SIGKILL: no cleanup code runs in the host
    host.wait().unwrap();
    wait_until("the orphaned child is gone", || !process_alive(child)).await;
}
