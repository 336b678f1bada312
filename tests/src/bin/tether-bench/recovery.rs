//! Recovery timeline: `tether serve` (stdio) supervises one stdio fixture; an rmcp client on
//! the gateway stamps `notifications/tools/list_changed`. Each run SIGKILLs the fixture and
//! times every step from the kill. Host-side steps come from the gateway's log timestamps
//! (`session ended`, the policy's state changes, `visible tools changed`); client-side steps
//! from the client's clock (same machine, same wall clock).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::stats::{Samples, ms};
use crate::util::{
    self, Agent, FAST_POLICY, echo_ok, scratch, signal, table, tether_serve, tool_names,
};

#[derive(clap::Parser)]
pub struct Args {
    /// Kill/recover runs.
    #[arg(long, default_value_t = 12)]
    runs: usize,
}

/// Seconds since midnight UTC, to compare with log timestamps.
fn day_secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64() % 86_400.0
}

/// A tracing log line's timestamp (`2026-11-29T12:36:02.123456Z ...`) as seconds since midnight.
fn log_time(line: &str) -> Option<f64> {
    let t = line.find('T')?;
    let clock = line.get(t + 1..)?.split(['Z', ' ']).next()?;
    let mut parts = clock.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

const STEPS: [&str; 7] = [
    "death noticed (session ended)",
    "policy decision: state → backing-off logged",
    "policy decision: tools withdrawn (registry, first action run)",
    "list_changed at the client (withdrawal)",
    "respawn (state → connecting)",
    "connected (handshake done)",
    "list_changed at the client (tools back)",
];

pub fn run(args: &Args) -> anyhow::Result<()> {
    println!(
        "\n## recovery: SIGKILL the upstream, {} runs, policy {FAST_POLICY}\n",
        args.runs
    );
    let dir = scratch("recovery");
    let state = dir.join("up");
    std::fs::create_dir_all(&state)?;
    let config = util::stdio_config(&dir, &state);
    let rt = util::runtime();
    // Per run: kill time, client stamps (withdrawal list_changed, tools-back list_changed, first ok call).
    let runs: Vec<(f64, f64, f64, f64)> = rt.block_on(async {
        let mut tether = tether_serve(&dir, &config, &[], "tether=info", false);
        let agent = Agent::default();
        let client = util::serve_over_stdio(&mut tether, agent.clone()).await;
        let peer = client.peer().clone();
        let wait_tools = async |present: bool| {
            let deadline = Instant::now() + Duration::from_secs(30);
            while tool_names(&peer).await.iter().any(|t| t == "up__echo") != present {
                assert!(
                    Instant::now() < deadline,
                    "tools never became present={present}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        wait_tools(true).await;
        assert!(echo_ok(&peer, "up__echo").await);
        let mut runs = Vec::new();
        for _ in 0..args.runs {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let pid: u32 = std::fs::read_to_string(state.join("pid"))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let seen = agent.list_changes.lock().unwrap().len();
            let killed = SystemTime::now();
            signal(pid, libc::SIGKILL);
            // Wait for two list_changed (withdrawn, back), then call until the first success.
            let deadline = Instant::now() + Duration::from_secs(30);
            while agent.list_changes.lock().unwrap().len() < seen + 2 {
                assert!(Instant::now() < deadline, "no list_changed after the kill");
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            while !echo_ok(&peer, "up__echo").await {
                assert!(
                    Instant::now() < deadline,
                    "no successful call after the kill"
                );
            }
            let ok = SystemTime::now();
            let stamps = agent.list_changes.lock().unwrap();
            runs.push((
                day_secs(killed),
                day_secs(stamps[seen]),
                day_secs(stamps[seen + 1]),
                day_secs(ok),
            ));
        }
        let _ = client.cancel().await;
        util::signal(tether.id().unwrap(), libc::SIGTERM);
        let _ = tokio::time::timeout(Duration::from_secs(10), tether.wait()).await;
        runs
    });

    let log: Vec<(f64, String)> = std::fs::read_to_string(dir.join("serve.log"))?
        .lines()
        .map(strip_ansi)
        .filter_map(|l| log_time(&l).map(|t| (t, l)))
        .collect();
    let first_after = |from: f64, until: f64, needles: &[&str]| {
        log.iter()
            .find(|(t, l)| *t >= from && *t < until && needles.iter().all(|n| l.contains(n)))
            .map(|(t, _)| *t)
    };
    // Per run, each step's time since the kill in seconds (None: not found in the log).
    let timelines: Vec<[Option<f64>; 8]> = runs
        .iter()
        .enumerate()
        .map(|(i, &(killed, withdrawn_lc, back_lc, ok))| {
            let until = runs.get(i + 1).map_or(f64::MAX, |r| r.0);
            let noticed = first_after(killed, until, &["session ended"]);
            let decided = first_after(killed, until, &["BackingOff"]);
            let withdrawn = first_after(killed, until, &["visible tools changed", "added=[]"]);
            let connecting = withdrawn
                .or(decided)
                .and_then(|d| first_after(d, until, &["ServerState::Connecting"]));
            let connected =
                connecting.and_then(|c| first_after(c, until, &["ServerState::Connected"]));
            [
                noticed,
                decided,
                withdrawn,
                Some(withdrawn_lc),
                connecting,
                connected,
                Some(back_lc),
                Some(ok),
            ]
            .map(|t| t.map(|t| (t - killed).max(0.0)))
        })
        .collect();
    let series = |f: &dyn Fn(&[Option<f64>; 8]) -> Option<f64>| {
        let nanos: Vec<u64> = timelines
            .iter()
            .filter_map(f)
            .map(|s| (s.max(0.0) * 1e9) as u64)
            .collect();
        (nanos.len(), Samples::new(nanos))
    };
    let mut rows = Vec::new();
    let names = STEPS.iter().copied().chain(["first successful call"]);
    for (step, name) in names.enumerate() {
        let (n, s) = series(&|t| t[step]);
        rows.push(vec![
            name.to_string(),
            ms(s.median()),
            ms(s.max()),
            n.to_string(),
        ]);
    }
    table(
        &["step (time since SIGKILL)", "median", "max", "runs"],
        &rows,
    );
    let gaps: [(&str, usize, usize); 4] = [
        (
            "withdraw decision (registry) → list_changed at the client",
            2,
            3,
        ),
        ("death noticed → withdraw decision", 0, 2),
        ("withdraw decision → respawn (backoff wait)", 2, 4),
        ("respawn → connected (server start + handshake)", 4, 5),
    ];
    let mut rows = Vec::new();
    for (name, a, b) in gaps {
        let (n, s) = series(&|t| Some(t[b]? - t[a]?));
        rows.push(vec![
            name.to_string(),
            ms(s.median()),
            ms(s.max()),
            n.to_string(),
        ]);
    }
    let (n, s) = series(&|t| Some(t[7]? - (t[5]? - t[2]?)));
    rows.push(vec![
        "kill → first ok call, minus decision → connected".into(),
        ms(s.median()),
        ms(s.max()),
        n.to_string(),
    ]);
    table(&["interval", "median", "max", "runs"], &rows);

    // The budget: first backoff + the fixture's own start (measured alone, same run) + 20 ms.
    let starts: Vec<Duration> = rt.block_on(async {
        let mut starts = Vec::new();
        for i in 0..10 {
            starts.push(crate::cold_start::fixture_start(&format!("recovery-start-{i}")).await);
        }
        starts
    });
    let start = Samples::from_durations(&starts).median();
    let budget = 50_000_000 + start + 20_000_000;
    let (_, back) = series(&|t| t[7]);
    println!(
        "fixture start alone (spawn → tools/list): {}; budget 50 ms + {} + 20 ms = {}; kill → first successful call: {} (median)\n",
        ms(start),
        ms(start),
        ms(budget),
        ms(back.median())
    );
    println!(
        "targets: ≤ 20 ms from the withdraw decision to list_changed; back within the first backoff (50 ms) + server start + 20 ms\n"
    );
    Ok(())
}
