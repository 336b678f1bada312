//! `chaos`: the chaos soak (`tether_tests::chaos`) at length. Unlike the other modes it asserts:
//! it exits 1 when an invariant broke, after printing the report.

use std::time::Duration;

use clap::Parser;
use tether_tests::chaos;

use crate::util;

#[derive(Parser, Debug)]
pub struct Args {
    /// Seconds of chaos (clients call throughout; settling and shutdown come after).
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Fixture servers, cycling through stdio, Streamable HTTP and legacy SSE.
    #[arg(long, default_value_t = 12)]
    servers: usize,
    /// MCP clients on the gateway.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Concurrent callers per client.
    #[arg(long, default_value_t = 4)]
    lanes: usize,
    /// Seed of the chaos schedule and of the clients' choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Limit on the gateway's peak RSS, MiB.
    #[arg(long, default_value_t = 256)]
    rss_limit_mib: u64,
    /// How long things may take to settle once chaos stops, seconds.
    #[arg(long, default_value_t = 30)]
    settle_secs: u64,
    /// Print each fault as it is applied.
    #[arg(long)]
    verbose: bool,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let dir = util::scratch("chaos");
    let mut options = chaos::Options::new(
        util::sibling("tether-cli"),
        util::sibling("mcp-fixture"),
        dir.clone(),
    );
    options.seconds = args.seconds;
    options.servers = args.servers;
    options.clients = args.clients;
    options.lanes = args.lanes;
    options.seed = args.seed;
    options.rss_limit_mib = args.rss_limit_mib;
    options.settle_within = Duration::from_secs(args.settle_secs);
    options.verbose = args.verbose;
    println!(
        "\n## chaos soak: {} s, {} servers, {} clients x {} lanes, seed {}\n",
        args.seconds, args.servers, args.clients, args.lanes, args.seed
    );
    let report = util::runtime().block_on(chaos::run(&options))?;
    println!();
    print!("{}", report.render());
    let failures = report.failures();
    if failures.is_empty() {
        println!("chaos soak passed: every invariant held.");
        Ok(())
    } else {
        for failure in &failures {
            println!("FAILED: {failure}");
        }
        // Keep the scratch dir (gateway log, fixture state) for a look.
        // (Beside the run's scratch base, which is removed on exit.)
        let kept = dir
            .parent()
            .and_then(|run| run.parent())
            .unwrap_or(&dir)
            .join(format!("tether-chaos-{}", std::process::id()));
        if std::fs::rename(&dir, &kept).is_ok() {
            println!("logs and fixture state kept in {}", kept.display());
        }
        anyhow::bail!("{} chaos invariants broke", failures.len())
    }
}
