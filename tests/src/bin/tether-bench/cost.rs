//! The gateway's own CPU cost per forwarded `tools/call`, in instructions counted by
//! `valgrind --tool=callgrind` (repeatable, unlike wall-clock figures on a shared VM).
//!
//! `tether serve` runs under callgrind on stdio in front of a stdio fixture (the fixture is not
//! traced). A client of each generation makes N echo calls; the same run with no calls is the
//! baseline, so startup, the policy and list polling cancel out:
//! instructions per call = (Ir(N calls) − Ir(0 calls)) / N. `--tether` measures another build
//! (e.g. an older commit's `tether-cli`) with the same client, for a before/after.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use crate::gateway::connect_client;
use crate::util::{self, echo_ok, scratch, table};

#[derive(clap::Parser)]
pub struct Args {
    /// Calls per measured run.
    #[arg(long, default_value_t = 2000)]
    calls: usize,
    /// The gateway binary to measure (default: the `tether-cli` next to this benchmark).
    #[arg(long)]
    tether: Option<PathBuf>,
}

/// Runs `tether serve` under callgrind with `calls` echo calls from a client of the given
/// generation; returns the instructions the gateway process executed.
async fn instructions(tether: &Path, name: &str, modern: bool, calls: usize) -> u64 {
    let dir = scratch(name);
    let state = dir.join("up");
    std::fs::create_dir_all(&state).unwrap();
    let config = util::stdio_config(&dir, &state);
    let out = dir.join("callgrind.%p.out");
    let mut serve = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(tether)
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--state-file")
        .arg(dir.join("state.json"))
        .arg("--log-dir")
        .arg(dir.join("logs"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("valgrind runs (install valgrind)");
    let pid = serve.id().expect("running");
    let io = (serve.stdout.take().unwrap(), serve.stdin.take().unwrap());
    let client = connect_client(io, modern).await;
    // Slow polls: every list the client sends is counted in both runs alike.
    util::wait_for_tool(
        client.peer(),
        "up__echo",
        Duration::from_secs(300),
        Duration::from_millis(200),
    )
    .await;
    for _ in 0..calls {
        assert!(echo_ok(client.peer(), "up__echo").await, "echo failed");
    }
    // Closing stdin ends `tether serve`; callgrind writes its counts on exit.
    let _ = client.cancel().await;
    tokio::time::timeout(Duration::from_secs(300), serve.wait())
        .await
        .expect("tether serve ends under callgrind")
        .expect("waiting for it");
    let text = std::fs::read_to_string(dir.join(format!("callgrind.{pid}.out")))
        .expect("callgrind's output for the gateway process");
    text.lines()
        .find_map(|line| {
            line.strip_prefix("summary:")
                .or(line.strip_prefix("totals:"))
        })
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .expect("an instruction total in callgrind's output")
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let tether = args
        .tether
        .clone()
        .unwrap_or_else(|| util::sibling("tether-cli"));
    println!(
        "\n## gateway-cost: instructions `{}` executes per forwarded echo call (callgrind, {} calls)\n",
        tether.display(),
        args.calls
    );
    let rt = util::runtime();
    // A first start compiles the policy into the cache; the measured runs load it.
    rt.block_on(instructions(&tether, "cost-warm", false, 0));
    let mut rows = Vec::new();
    for (modern, label) in [(false, "2025-11-25"), (true, "2026-07-28")] {
        let (base, loaded) = rt.block_on(async {
            let base = instructions(&tether, &format!("cost-{label}-0"), modern, 0).await;
            let loaded =
                instructions(&tether, &format!("cost-{label}-n"), modern, args.calls).await;
            (base, loaded)
        });
        let per_call = loaded.saturating_sub(base) as f64 / args.calls as f64;
        rows.push(vec![
            label.to_string(),
            base.to_string(),
            loaded.to_string(),
            format!("{per_call:.0}"),
        ]);
    }
    table(
        &[
            "client protocol",
            "Ir, 0 calls",
            &format!("Ir, {} calls", args.calls),
            "Ir per call",
        ],
        &rows,
    );
    Ok(())
}
