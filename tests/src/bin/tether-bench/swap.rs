//! Hot swap under load: an in-process supervisor with one stdio fixture serves echo calls from
//! concurrent callers while the policy is swapped back and forth, in two rounds of the same run:
//! between builds of the embedded default (the state moves by snapshot), then between the
//! default and the test component `other`, another implementation with its own state format
//! (the state moves by handover). Counts failed calls, compares call latency during swaps with
//! latency between them, and checks the policy state survives.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tether::config::ServerSpec;
use tether::policy::{PolicyEngine, PolicyRuntime, PolicySource, RuntimeOptions};
use tether::supervisor::Supervisor;

use crate::stats::{Samples, ms, us};
use crate::util::{self, FAST_POLICY, fixture, scratch, table};

#[derive(clap::Parser)]
pub struct Args {
    /// Seconds of load.
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// Milliseconds between swaps.
    #[arg(long, default_value_t = 250)]
    every_ms: u64,
    /// Concurrent callers.
    #[arg(long, default_value_t = 8)]
    callers: usize,
}

pub fn start_supervisor(
    dir: &std::path::Path,
    engine: Arc<PolicyEngine>,
) -> anyhow::Result<Supervisor> {
    let policy = PolicyRuntime::start(RuntimeOptions {
        engine: Some(engine),
        settings: FAST_POLICY.into(),
        ..RuntimeOptions::default()
    })?;
    Ok(Supervisor::start(policy, dir.join("logs")))
}

pub fn fixture_spec(name: &str, state: &std::path::Path) -> ServerSpec {
    std::fs::create_dir_all(state).unwrap();
    let state = state.display().to_string();
    ServerSpec::stdio(
        name,
        fixture(),
        &["--transport", "stdio", "--state-dir", &state],
    )
}

/// One finished call: when it started and ended, and whether it succeeded.
struct Call {
    start: Instant,
    end: Instant,
    ok: bool,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    println!(
        "\n## swap: policy hot swaps every {} ms under {} concurrent echo callers, {} s per round\n",
        args.every_ms, args.callers, args.secs
    );
    let other = PolicySource::File(env!("TETHER_TEST_POLICY_OTHER").into());
    let mut pauses = Vec::new();
    for (title, partner) in [
        (
            "same implementation (snapshot): default <-> default",
            PolicySource::Embedded,
        ),
        (
            "another implementation (handover): default <-> other",
            other,
        ),
    ] {
        println!("### {title}\n");
        pauses.push(round(args, partner)?);
    }
    if let [same, cross] = pauses.as_slice() {
        println!(
            "pause, handover / snapshot: median {:.2}x, max {:.2}x\n",
            cross.0 as f64 / same.0.max(1) as f64,
            cross.1 as f64 / same.1.max(1) as f64
        );
    }
    Ok(())
}

/// One round of swaps between the default and `partner`; returns the median and max pause (ns).
fn round(args: &Args, partner: PolicySource) -> anyhow::Result<(u64, u64)> {
    let dir = scratch("swap");
    let rt = util::runtime();
    let wrong = partner;
    let (calls, swaps, kept) = rt.block_on(async {
        let engine = PolicyEngine::new(None).expect("engine");
        let supervisor = start_supervisor(&dir, engine.clone()).expect("supervisor");
        supervisor
            .add_server(fixture_spec("up", &dir.join("up")))
            .expect("add");
        let deadline = Instant::now() + Duration::from_secs(30);
        while supervisor.registry().server_tools("up").is_empty() {
            assert!(Instant::now() < deadline, "the fixture never came up");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Warm both components into the engine's cache, as an operator's first swap would be.
        engine.load(&wrong).expect("the partner policy loads");
        let arguments = serde_json::json!({"text": "hi"}).as_object().cloned();
        let stop = Arc::new(AtomicBool::new(false));
        let callers: Vec<_> = (0..args.callers)
            .map(|_| {
                let (supervisor, stop, arguments) =
                    (supervisor.clone(), stop.clone(), arguments.clone());
                tokio::spawn(async move {
                    let mut calls = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let start = Instant::now();
                        let result = supervisor.call_tool("up__echo", arguments.clone()).await;
                        let ok = matches!(&result, Ok(r) if r.is_error != Some(true));
                        calls.push(Call {
                            start,
                            end: Instant::now(),
                            ok,
                        });
                    }
                    calls
                })
            })
            .collect();
        // One second of load without swaps first: the baseline of the same run.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = supervisor.policy_status().await;
        let mut swaps = Vec::new();
        let end = Instant::now() + Duration::from_secs(args.secs.saturating_sub(1).max(1));
        let mut to_wrong = true;
        while Instant::now() < end {
            let source = if to_wrong {
                wrong.clone()
            } else {
                PolicySource::Embedded
            };
            let start = Instant::now();
            supervisor.swap_policy(source).await.expect("swap succeeds");
            swaps.push((start, Instant::now()));
            to_wrong = !to_wrong;
            tokio::time::sleep(Duration::from_millis(args.every_ms)).await;
        }
        if !to_wrong {
            supervisor
                .swap_policy(PolicySource::Embedded)
                .await
                .expect("swap back");
        }
        let after = supervisor.policy_status().await;
        stop.store(true, Ordering::Relaxed);
        let mut calls = Vec::new();
        for caller in callers {
            calls.extend(caller.await.expect("caller"));
        }
        supervisor.shutdown().await;
        // Same servers, states, breakers and counters (the calls only prove the session).
        let key = |s: &tether::policy::ServerStatus| {
            (
                s.server.clone(),
                s.state,
                s.breaker,
                s.failures,
                s.published_tools,
            )
        };
        let kept = before.iter().map(key).eq(after.iter().map(key));
        (calls, swaps, kept)
    });

    let first = calls.iter().map(|c| c.start).min().unwrap();
    let last = calls.iter().map(|c| c.end).max().unwrap();
    let failed = calls.iter().filter(|c| !c.ok).count();
    let overlaps = |c: &Call| swaps.iter().any(|(s, e)| c.start < *e && c.end > *s);
    let latency = |c: &Call| (c.end - c.start).as_nanos() as u64;
    let during = Samples::new(calls.iter().filter(|c| overlaps(c)).map(latency).collect());
    let between = Samples::new(calls.iter().filter(|c| !overlaps(c)).map(latency).collect());
    let swap_times = Samples::new(
        swaps
            .iter()
            .map(|(s, e)| (*e - *s).as_nanos() as u64)
            .collect(),
    );
    // The longest stretch in each swap window with no call finishing: the pause callers saw.
    let mut ends: Vec<Instant> = calls.iter().map(|c| c.end).collect();
    ends.sort();
    let pauses = Samples::new(
        swaps
            .iter()
            .map(|(s, e)| {
                let mut prev = *s;
                let mut gap = Duration::ZERO;
                for end in ends.iter().filter(|t| **t > *s) {
                    gap = gap.max(*end - prev);
                    prev = *end;
                    if *end > *e {
                        break;
                    }
                }
                gap.as_nanos() as u64
            })
            .collect(),
    );
    let gaps_between = Samples::new(
        ends.windows(2)
            .map(|w| (w[1] - w[0]).as_nanos() as u64)
            .collect(),
    );
    let rate = calls.len() as f64 / (last - first).as_secs_f64();
    let rows = vec![
        vec![
            "calls / failed".into(),
            format!("{} / {failed}", calls.len()),
            format!("{rate:.0} calls/s"),
        ],
        vec![
            "swaps (swap() call: load + state move)".into(),
            swaps.len().to_string(),
            format!(
                "median {}, max {}",
                ms(swap_times.median()),
                ms(swap_times.max())
            ),
        ],
        vec![
            "call latency overlapping a swap".into(),
            during.len().to_string(),
            format!(
                "p50 {}, p99 {}, max {}",
                us(during.median()),
                us(during.quantile(0.99)),
                us(during.max())
            ),
        ],
        vec![
            "call latency between swaps".into(),
            between.len().to_string(),
            format!(
                "p50 {}, p99 {}, max {}",
                us(between.median()),
                us(between.quantile(0.99)),
                us(between.max())
            ),
        ],
        vec![
            "longest gap between call completions in a swap window (pause)".into(),
            pauses.len().to_string(),
            format!("median {}, max {}", ms(pauses.median()), ms(pauses.max())),
        ],
        vec![
            "gap between call completions, whole run".into(),
            gaps_between.len().to_string(),
            format!(
                "p99 {}, max {}",
                us(gaps_between.quantile(0.99)),
                us(gaps_between.max())
            ),
        ],
        vec![
            "policy state kept across all swaps".into(),
            "-".into(),
            kept.to_string(),
        ],
    ];
    table(&["measurement", "n", "value"], &rows);
    println!("targets: ≥ 1000 calls/s, 0 failed calls, pause ≤ 5 ms, state kept\n");
    Ok((pauses.median(), pauses.max()))
}
