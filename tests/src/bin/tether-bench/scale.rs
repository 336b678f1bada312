//! Scale: an in-process supervisor with N stdio fixture servers. Measures the time until every
//! server's tools are published, this process's RSS (children are separate processes, so they
//! are excluded) before and after, and its CPU use while idle.

use std::time::{Duration, Instant};

use tether::policy::PolicyEngine;

use crate::stats::ms;
use crate::swap::{fixture_spec, start_supervisor};
use crate::util::{self, scratch, table};

#[derive(clap::Parser)]
pub struct Args {
    /// Server counts.
    #[arg(long, value_delimiter = ',', default_value = "100")]
    sizes: Vec<usize>,
    /// Seconds of idle CPU measurement.
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
    /// Seconds to wait once all are ready before measuring: each session's first keepalive,
    /// which proves it, comes 5 s after it opens.
    #[arg(long, default_value_t = 6)]
    settle_secs: u64,
}

/// This process's resident set in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// This process's user + system CPU time (all threads, children excluded).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_secs_f64(ticks as f64 / hz as f64)
}

/// Raises the open-files limit to the hard limit (each child holds pipes).
fn raise_nofile() {
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    println!(
        "\n## scale: N supervised stdio fixtures, idle CPU over {} s (after {} s to settle)\n",
        args.idle_secs, args.settle_secs
    );
    raise_nofile();
    let rt = util::runtime();
    let engine = PolicyEngine::new(None)?;
    let mut rows = Vec::new();
    for &n in &args.sizes {
        let dir = scratch(&format!("scale-{n}"));
        let row = rt.block_on(async {
            let supervisor = start_supervisor(&dir, engine.clone()).expect("supervisor");
            tokio::time::sleep(Duration::from_millis(200)).await;
            let rss_before = rss_kib();
            let start = Instant::now();
            for i in 0..n {
                let name = format!("s{i}");
                supervisor
                    .add_server(fixture_spec(&name, &dir.join(&name)))
                    .expect("add");
            }
            let deadline = start + Duration::from_secs(600);
            let mut ready = 0;
            while ready < n {
                ready = (0..n)
                    .filter(|i| {
                        !supervisor
                            .registry()
                            .server_tools(&format!("s{i}"))
                            .is_empty()
                    })
                    .count();
                assert!(Instant::now() < deadline, "only {ready}/{n} servers ready");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let ready_after = start.elapsed();
            tokio::time::sleep(Duration::from_secs(args.settle_secs)).await;
            let rss_ready = rss_kib();
            let cpu0 = cpu_time();
            let wall0 = Instant::now();
            tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
            let idle = (cpu_time() - cpu0).as_secs_f64() / wall0.elapsed().as_secs_f64();
            let rss_idle = rss_kib();
            supervisor.shutdown().await;
            let per_server = (rss_idle.max(rss_ready) - rss_before) as f64 / n as f64;
            vec![
                n.to_string(),
                ms(ready_after.as_nanos() as u64),
                format!("{} KiB", rss_before),
                format!("{} KiB", rss_ready),
                format!("{} KiB", rss_idle),
                format!("{per_server:.1} KiB"),
                format!("{:.3} %", idle * 100.0),
            ]
        });
        rows.push(row);
    }
    table(
        &[
            "servers",
            "all ready after",
            "host RSS before",
            "RSS when ready",
            "RSS after idle",
            "per server",
            "idle CPU (of one core)",
        ],
        &rows,
    );
    println!("targets: ≤ 100 KiB host memory per server, idle CPU < 1 %\n");
    Ok(())
}
