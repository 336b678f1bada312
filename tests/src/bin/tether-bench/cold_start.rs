//! Cold start: `tether serve` (stdio, one stdio fixture upstream) from process start to the
//! first `tools/list` answered and to the first one listing the upstream's tools, against the
//! fixture alone (start → initialize → `tools/list`) measured in the same run.

use std::time::{Duration, Instant};

use crate::stats::{Samples, ms};
use crate::util::{self, Agent, scratch, table, tether_serve, tool_names};

#[derive(clap::Parser)]
pub struct Args {
    /// Starts of each kind.
    #[arg(long, default_value_t = 15)]
    runs: usize,
}

/// The fixture alone over stdio: spawn → initialize → first `tools/list` answered.
pub async fn fixture_start(name: &str) -> Duration {
    let state = scratch(name);
    let start = Instant::now();
    let mut child = util::spawn_stdio_fixture(&state);
    let client = util::serve_over_stdio(&mut child, Agent::default()).await;
    assert!(!tool_names(client.peer()).await.is_empty());
    let took = start.elapsed();
    let _ = client.cancel().await;
    took
}

/// `tether serve`: (first tools/list answered, first tools/list with the upstream's tools).
async fn tether_start(name: &str, cache: &std::path::Path) -> (Duration, Duration) {
    let dir = scratch(name);
    let state = dir.join("up");
    std::fs::create_dir_all(&state).unwrap();
    let config = util::stdio_config(&dir, &state);
    let cache = cache.display().to_string();
    let start = Instant::now();
    let mut tether = tether_serve(&dir, &config, &["--cache-dir", &cache], "info", false);
    let client = util::serve_over_stdio(&mut tether, Agent::default()).await;
    let mut first = None;
    loop {
        let names = tool_names(client.peer()).await;
        first.get_or_insert(start.elapsed());
        if names.iter().any(|n| n == "up__echo") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no tools from the upstream"
        );
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let full = start.elapsed();
    let _ = client.cancel().await;
    (first.unwrap(), full)
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    println!(
        "\n## cold start: process start → first tools/list ({} runs each)\n",
        args.runs
    );
    let rt = util::runtime();
    let cache = scratch("cold-cache");
    let (mut fixture_alone, mut first, mut full) = (Vec::new(), Vec::new(), Vec::new());
    let (cold_first, cold_full) = rt.block_on(async {
        // The first start finds the cache empty (the embedded policy comes precompiled).
        let cold = tether_start("cold-0", &cache).await;
        for i in 0..args.runs {
            fixture_alone.push(fixture_start(&format!("cold-fixture-{i}")).await);
            let (a, b) = tether_start(&format!("cold-{}", i + 1), &cache).await;
            first.push(a);
            full.push(b);
        }
        cold
    });
    let fixture_alone = Samples::from_durations(&fixture_alone);
    let first = Samples::from_durations(&first);
    let full = Samples::from_durations(&full);
    let rows = vec![
        vec![
            "mcp-fixture alone: start → tools/list".into(),
            ms(fixture_alone.median()),
            ms(fixture_alone.max()),
            "-".into(),
        ],
        vec![
            "tether serve: start → first tools/list answered".into(),
            ms(first.median()),
            ms(first.max()),
            "-".into(),
        ],
        vec![
            "tether serve: start → tools/list with the upstream's tools".into(),
            ms(full.median()),
            ms(full.max()),
            ms(full.median().saturating_sub(fixture_alone.median())),
        ],
        vec![
            "tether serve, empty policy cache, 1 run".into(),
            format!(
                "{} / {}",
                ms(cold_first.as_nanos() as u64),
                ms(cold_full.as_nanos() as u64)
            ),
            "-".into(),
            ms((cold_full.as_nanos() as u64).saturating_sub(fixture_alone.median())),
        ],
    ];
    table(
        &["measurement", "median", "max", "over the fixture alone"],
        &rows,
    );
    println!("target: ≤ 50 ms plus server startup\n");
    Ok(())
}
