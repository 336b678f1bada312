//! The chaos soak: the real `tether serve --http` in front of many fixture servers over stdio,
//! Streamable HTTP and legacy SSE, while several MCP clients call tools through it and a seeded
//! schedule kills, hangs, flaps, restarts and garbles the servers. Then chaos stops, every
//! fixture is made healthy, and the soak checks invariants, not timings:
//!
//! - every call was answered, or refused with one of Tether's messages (naming the server,
//!   saying whether the call was sent), within its deadline plus a margin: none hung;
//! - no call of a tool that is not read-only ran twice (each call carries a unique id, which the
//!   fixtures log); an ok answer ran, a "not sent" refusal did not, and nothing ran elsewhere;
//! - once settled, `tools/list` shows exactly the tools of the servers that `tether status`
//!   reports with a live session (no phantoms), and every server answers again;
//! - calls in flight when SIGTERM comes are answered (a slow one with its result, a hung one
//!   with the timeout message), the gateway exits 0, and no fixture process of its stdio
//!   servers is left;
//! - the gateway's peak RSS stays under a limit.
//!
//! `tether-bench chaos` runs it at length; `tests/tests/chaos.rs` runs a short one in CI.

pub mod clients;
pub mod fleet;
pub mod gateway;
pub mod report;
pub mod rng;
pub mod schedule;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::{Peer, RoleClient};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use clients::{Calls, Clients, Outcome, ToolKind};
use fleet::{FixtureCommand, Keeper, KeeperCommand, Server};
use gateway::{Admin, Gateway, ServerStatus};
use report::{Chaos, Executions, Memory, Report, Settle, Shutdown};
use rng::Rng;
use schedule::{Event, Fault, Transport};

/// Per-server deadlines in the generated config: short, so that hung calls end quickly.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);
pub const RECONNECT_WAIT: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: &str = "3s";
/// The longest path through Tether's call: wait for a fresh session, call, find it was not
/// sent (or lost, for a read-only tool), wait again, call again.
pub const DEADLINE: Duration =
    Duration::from_secs(2 * (CALL_TIMEOUT.as_secs() + RECONNECT_WAIT.as_secs()));
/// Allowance over [`DEADLINE`] for a loaded machine (scheduling, process starts).
pub const MARGIN: Duration = Duration::from_secs(4);
/// How much longer than deadline + margin a client waits before it calls a call hung.
const PATIENCE_AFTER_BOUND: Duration = Duration::from_secs(8);
/// How long SIGTERM may take (Tether drains calls in flight for up to 30 s by default; the
/// soak's last ones end within the call timeout).
const SHUTDOWN_WITHIN: Duration = Duration::from_secs(45);

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Seconds of chaos (clients call throughout).
    pub seconds: f64,
    pub servers: usize,
    pub clients: usize,
    /// Concurrent callers per client.
    pub lanes: usize,
    pub seed: u64,
    /// The `tether` binary (`tether-cli` in this package).
    pub tether: PathBuf,
    pub fixture: PathBuf,
    /// Scratch directory: config, gateway log, fixture state.
    pub dir: PathBuf,
    pub rss_limit_mib: u64,
    /// How long things may take to settle once chaos stops.
    pub settle_within: Duration,
    /// Print each fault as it is applied.
    pub verbose: bool,
}

impl Options {
    pub fn new(tether: PathBuf, fixture: PathBuf, dir: PathBuf) -> Options {
        Options {
            seconds: 60.0,
            servers: 12,
            clients: 4,
            lanes: 4,
            seed: 1,
            tether,
            fixture,
            dir,
            rss_limit_mib: 256,
            settle_within: Duration::from_secs(30),
            verbose: false,
        }
    }
}

/// The policy settings of the soak: fast backoff, short parks and breakers, seeded jitter.
pub fn policy_settings(seed: u64) -> String {
    json!({
        "seed": seed,
        "backoff": {"base_ms": 50, "cap_ms": 500, "jitter": "full"},
        "park": {"probe_initial_ms": 500, "probe_max_ms": 2000},
        "breaker": {"failure_threshold": 3, "open_ms": 500, "open_max_ms": 2000},
    })
    .to_string()
}

fn server_config(fixture: &Path, server: &Server) -> serde_json::Value {
    let timeouts = json!({
        "connect": CONNECT_TIMEOUT,
        "call": format!("{}s", CALL_TIMEOUT.as_secs()),
        "reconnect_wait": format!("{}s", RECONNECT_WAIT.as_secs()),
        "keepalive": "5s",
        "keepalive_deadline": "2s",
        "stop_grace": "500ms",
    });
    match (&server.transport, &server.keeper) {
        (Transport::Http, Some(keeper)) => json!({
            "type": "http",
            "url": format!("http://{}/mcp", keeper.addr),
            "timeouts": timeouts,
        }),
        (Transport::Sse, Some(keeper)) => json!({
            "type": "sse",
            "url": format!("http://{}/sse", keeper.addr),
            "timeouts": timeouts,
        }),
        _ => json!({
            "command": fixture.display().to_string(),
            "args": FixtureCommand::stdio_args(&server.state),
            "timeouts": timeouts,
        }),
    }
}

/// Sets up `count` fixture servers in `dir`, cycling through stdio, Streamable HTTP and legacy
/// SSE: the HTTP/SSE fixtures start now, under keepers (their ports go into the config); the
/// stdio ones are Tether's to spawn. Writes the gateway's `mcpServers` config and returns its
/// path. stdio state directories are under `dir/stdio/`, the others under `dir/http/`.
pub async fn fleet(
    fixture: &Path,
    dir: &Path,
    count: usize,
    seed: u64,
) -> anyhow::Result<(Vec<Arc<Server>>, PathBuf)> {
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    let mut servers = Vec::new();
    for index in 0..count {
        let transport = Transport::of_server(index);
        let name = format!("{}-{index:02}", transport.name());
        let root = match transport {
            Transport::Stdio => dir.join("stdio"),
            Transport::Http | Transport::Sse => dir.join("http"),
        };
        let state = root.join(&name);
        std::fs::create_dir_all(&state)?;
        let keeper = if transport == Transport::Stdio {
            None
        } else {
            let command = FixtureCommand {
                fixture: fixture.to_path_buf(),
                transport,
                state: state.clone(),
                log: logs.join(format!("{name}.fixture.log")),
            };
            let rng = Rng::fork(seed, 10_000 + index as u64);
            Some(
                Keeper::start(command, rng)
                    .await
                    .map_err(|e| anyhow::anyhow!("{name}: {e}"))?,
            )
        };
        servers.push(Arc::new(Server {
            name,
            transport,
            state,
            keeper,
        }));
    }
    let config: serde_json::Map<String, serde_json::Value> = servers
        .iter()
        .map(|s| (s.name.clone(), server_config(fixture, s)))
        .collect();
    let path = dir.join("servers.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&json!({ "mcpServers": config }))?,
    )?;
    Ok((servers, path))
}

/// Prints a line stamped with the time since `start`.
fn say(start: Instant, what: impl std::fmt::Display) {
    println!("[{:7.2}s] {what}", start.elapsed().as_secs_f64());
}

/// Runs the soak. An `Err` is a setup failure (the gateway or a fixture could not start);
/// broken invariants are in [`Report::failures`].
pub async fn run(options: &Options) -> anyhow::Result<Report> {
    let start = Instant::now();
    let o = options;
    anyhow::ensure!(
        o.servers > 0 && o.clients > 0 && o.lanes > 0,
        "nothing to soak"
    );
    let stdio_root = o.dir.join("stdio");

    let (servers, config_path) = fleet(&o.fixture, &o.dir, o.servers, o.seed).await?;

    let names: Vec<String> = servers.iter().map(|s| s.name.clone()).collect();
    let transports: Vec<Transport> = servers.iter().map(|s| s.transport).collect();
    let chaos_for = Duration::from_secs_f64(o.seconds);
    let schedule = schedule::draw(o.seed, &transports, chaos_for);
    println!(
        "chaos schedule, seed {} ({} faults over {:.1} s; replay with --seed {}):",
        o.seed,
        schedule.len(),
        o.seconds,
        o.seed
    );
    for event in &schedule {
        println!("  {}", event.line(&names));
    }

    let gateway = Gateway::start(&o.tether, &o.dir, &config_path, &policy_settings(o.seed)).await?;
    say(
        start,
        format!(
            "tether serve (pid {}) at {}; config {}",
            gateway.pid,
            gateway.url,
            config_path.display()
        ),
    );
    let (probe, _) = clients::connect(&gateway.url).await?;
    let expected: BTreeSet<String> = names
        .iter()
        .flat_map(|n| ToolKind::ALL.map(|t| format!("{n}__{}", t.name())))
        .collect();
    let ready_by = Instant::now() + Duration::from_secs(60);
    loop {
        let listed: BTreeSet<String> = clients::list(probe.peer())
            .await
            .unwrap_or_default()
            .into_iter()
            .collect();
        if listed == expected {
            break;
        }
        anyhow::ensure!(
            Instant::now() < ready_by,
            "the gateway did not list every server's tools within 60 s: {} of {}",
            listed.len(),
            expected.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    say(
        start,
        format!("all {} servers' tools listed", servers.len()),
    );

    // Memory, sampled throughout.
    let (rss_ready, _) = gateway.memory().unwrap_or_default();
    let fds_ready = gateway.open_fds().unwrap_or(0);
    let rss_max = Arc::new(AtomicU64::new(rss_ready));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (rss_max, sampling, pid) = (rss_max.clone(), sampling.clone(), gateway.pid);
        tokio::spawn(async move {
            while sampling.load(Ordering::SeqCst) {
                if let Some((rss, _)) = gateway::memory(pid) {
                    rss_max.fetch_max(rss, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    // Clients and chaos.
    let t0 = Instant::now();
    let bound = DEADLINE + MARGIN;
    let calls = Arc::new(Calls::new(t0, bound + PATIENCE_AFTER_BOUND));
    let agents = Clients::start(&gateway.url, o.clients, o.lanes, o.seed, calls.clone()).await?;
    say(
        start,
        format!(
            "{} clients x {} lanes calling; chaos for {:.1} s",
            o.clients, o.lanes, o.seconds
        ),
    );
    let (stop_tx, stop_rx) = watch::channel(false);
    let tally = Arc::new(Mutex::new(Chaos {
        events: schedule.len(),
        ..Chaos::default()
    }));
    let mut by_server: HashMap<usize, Vec<Event>> = HashMap::new();
    for event in schedule {
        by_server.entry(event.server).or_default().push(event);
    }
    let mut chaos_tasks = Vec::new();
    for (index, events) in by_server {
        chaos_tasks.push(tokio::spawn(inflict(
            servers[index].clone(),
            events,
            t0,
            gateway.admin.clone(),
            stop_rx.clone(),
            tally.clone(),
            o.verbose.then_some(start),
        )));
    }
    let chaos_end = t0 + chaos_for;
    while Instant::now() < chaos_end {
        let next = (Instant::now() + Duration::from_secs(10)).min(chaos_end);
        tokio::time::sleep_until(next).await;
        if Instant::now() < chaos_end {
            say(start, format!("{} calls so far", calls.count()));
        }
    }
    let _ = stop_tx.send(true);
    for task in chaos_tasks {
        let _ = task.await;
    }
    // Every fixture healthy again: flags only, HTTP fixtures up.
    for server in &servers {
        server.clear_control();
        if let Some(keeper) = &server.keeper {
            keeper.send(KeeperCommand::Up);
        }
    }
    say(
        start,
        "chaos stopped; fixtures healthy again; waiting for calls in flight",
    );
    agents.stop().await;
    say(
        start,
        format!("clients stopped after {} calls", calls.count()),
    );

    let mut settle = settle(
        &gateway.admin,
        probe.peer(),
        &servers,
        &expected,
        o.settle_within,
    )
    .await;
    say(
        start,
        match settle.settled_after {
            Some(after) => format!("settled after {:.2} s", after.as_secs_f64()),
            None => format!("NOT settled within {:?}", o.settle_within),
        },
    );
    verify(&calls, probe.peer(), &servers, &mut settle).await;

    // Shutdown.
    let (_, hwm) = gateway.memory().unwrap_or_default();
    let fds_end = gateway.open_fds().unwrap_or(0);
    sampling.store(false, Ordering::SeqCst);
    let _ = sampler.await;
    let in_flight = start_calls_in_flight(&calls, probe.peer(), &servers).await;
    say(
        start,
        format!(
            "{} calls in flight (slow or hung servers); SIGTERM",
            in_flight.len()
        ),
    );
    let (exit_code, took, exited) = gateway.terminate(SHUTDOWN_WITHIN).await;
    let mut answered_in_flight = Vec::new();
    for (server, expected, task) in in_flight {
        let outcome = task.await.unwrap_or(Outcome::Hung);
        answered_in_flight.push((server, expected, outcome));
    }
    let _ = probe.cancel().await;
    let needle = format!("{}/", stdio_root.display());
    let leftovers = fleet::processes_naming(&needle);
    say(
        start,
        format!(
            "gateway exited (code {exit_code:?}) {:.0} ms after SIGTERM; {} fixture processes left",
            took.as_secs_f64() * 1000.0,
            leftovers.len()
        ),
    );
    for (pid, _) in &leftovers {
        fleet::signal(*pid, libc::SIGKILL);
    }
    let mut rebinds = 0;
    for server in &servers {
        if let Some(keeper) = &server.keeper {
            rebinds += keeper.stop().await.failed_starts;
        }
    }

    let records = std::mem::take(&mut *calls.records.lock().unwrap());
    let list_failures = std::mem::take(&mut *calls.list_failures.lock().unwrap());
    let logs: Vec<(String, String)> = servers
        .iter()
        .map(|s| (s.name.clone(), s.calls_log()))
        .collect();
    let executions = Executions::check(&records, &logs);
    write_calls(&o.dir.join("calls.tsv"), &records);
    let mut chaos = std::mem::take(&mut *tally.lock().unwrap());
    chaos.http_rebind_retries = rebinds;
    for server in &servers {
        *chaos.starts.entry(server.transport).or_default() += server.starts();
    }
    Ok(Report {
        seed: o.seed,
        seconds: o.seconds,
        servers: servers
            .iter()
            .map(|s| (s.name.clone(), s.transport))
            .collect(),
        clients: o.clients,
        lanes: o.lanes,
        deadline: DEADLINE,
        bound,
        records,
        list_failures,
        executions,
        chaos,
        settle,
        shutdown: Shutdown {
            exited,
            exit_code,
            took,
            leftovers,
            in_flight: answered_in_flight,
        },
        memory: Memory {
            rss_ready_kib: rss_ready,
            rss_max_kib: rss_max.load(Ordering::SeqCst),
            hwm_kib: hwm,
            limit_kib: o.rss_limit_mib * 1024,
            fds_ready,
            fds_end,
        },
        took: start.elapsed(),
    })
}

/// A call in flight when SIGTERM comes: its server, the outcome it must have, its task.
type InFlight = (String, Outcome, tokio::task::JoinHandle<Outcome>);

/// Makes the first server of each transport slow (1 s) and the last one hang, starts a call on
/// each, and returns once every call is running in its fixture (`calls.log` grew). Tether must
/// answer the slow ones (the drain waits for them) and time the hung one out, not cut them.
async fn start_calls_in_flight(
    calls: &Arc<Calls>,
    peer: &Peer<RoleClient>,
    servers: &[Arc<Server>],
) -> Vec<InFlight> {
    let mut chosen: Vec<(Arc<Server>, Outcome)> = Vec::new();
    for transport in [Transport::Stdio, Transport::Http, Transport::Sse] {
        if let Some(server) = servers.iter().find(|s| s.transport == transport) {
            server.control(json!({"slow_ms": 1000}));
            chosen.push((server.clone(), Outcome::Ok));
        }
    }
    if let Some(last) = servers.last().filter(|_| servers.len() > 3) {
        last.control(json!({"slow_ms": 1_000_000_000u64}));
        chosen.push((last.clone(), Outcome::TimedOut));
    }
    let mut started = Vec::new();
    for (server, expected) in chosen {
        let ran_before = server.calls_log().lines().count();
        let (calls, peer, name) = (calls.clone(), peer.clone(), server.name.clone());
        let task = tokio::spawn(async move {
            let advertised = format!("{name}__side_effect");
            calls
                .call(&peer, None, &name, ToolKind::SideEffect, &advertised)
                .await
        });
        let by = Instant::now() + Duration::from_secs(15);
        while server.calls_log().lines().count() == ran_before
            && !task.is_finished()
            && Instant::now() < by
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        started.push((server.name.clone(), expected, task));
    }
    started
}

/// Every call, one line each (for a look after a run): id, client, server, tool, start and
/// latency in ms, outcome.
fn write_calls(path: &std::path::Path, records: &[clients::CallRecord]) {
    let mut text = String::from("id\tclient\tserver\ttool\tstart_ms\tlatency_ms\toutcome\n");
    for r in records {
        text.push_str(&format!(
            "{}\t{}\t{}\t{}\t{:.1}\t{:.1}\t{:?}\n",
            r.id,
            r.client.map_or("verify".to_string(), |c| c.to_string()),
            r.server,
            r.tool.name(),
            r.started.as_secs_f64() * 1000.0,
            r.latency.as_secs_f64() * 1000.0,
            r.outcome
        ));
    }
    let _ = std::fs::write(path, text);
}

/// Waits until `at`; false if the chaos was stopped first.
async fn until(at: Instant, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        () = tokio::time::sleep_until(at) => true,
        _ = stop.wait_for(|stopped| *stopped) => false,
    }
}

/// Applies one server's faults in order until the chaos stops.
async fn inflict(
    server: Arc<Server>,
    events: Vec<Event>,
    t0: Instant,
    admin: Admin,
    mut stop: watch::Receiver<bool>,
    tally: Arc<Mutex<Chaos>>,
    verbose: Option<Instant>,
) {
    for event in events {
        if !until(t0 + event.at, &mut stop).await {
            return;
        }
        if let Some(start) = verbose {
            say(start, format!("{} {event}", server.name));
        }
        let applied = match event.fault {
            Fault::Kill => server.kill(event.restart_after),
            Fault::Down => server
                .keeper
                .as_ref()
                .is_some_and(|k| k.send(KeeperCommand::Down)),
            Fault::FailStarts => {
                server.control(json!({"fail_initializes": 1_000_000_000_000u64}));
                server.kill(event.restart_after)
            }
            Fault::Hang => {
                server.control(json!({"slow_ms": 1_000_000_000u64}));
                true
            }
            Fault::Slow(ms) => {
                server.control(json!({ "slow_ms": ms }));
                true
            }
            Fault::Flap => {
                server.control(json!({"flap": true}));
                server.kill(event.restart_after)
            }
            Fault::Garbage => {
                server.control(json!({"garbage": true}));
                true
            }
            Fault::CrashMidCall => {
                server.control(json!({"crash_after_calls": 1}));
                true
            }
            Fault::CrashAfterAnswer => {
                server.control(json!({"crash_after_answers": 1}));
                true
            }
            Fault::Stubborn => {
                server.control(json!({"stubborn": true}));
                server.kill(event.restart_after)
            }
            Fault::Reconnect => {
                let accepted = admin.reconnect(&server.name).await;
                if !accepted {
                    tally.lock().unwrap().reconnects_refused += 1;
                }
                true
            }
        };
        {
            let mut tally = tally.lock().unwrap();
            *tally.applied.entry(event.fault.kind()).or_default() += 1;
            if !applied && server.transport == Transport::Stdio {
                tally.kills_missed += 1;
            }
        }
        if event.fault.instant() {
            continue;
        }
        let reached = until(t0 + event.at + event.lasts, &mut stop).await;
        match event.fault {
            Fault::Down => {
                if let Some(keeper) = &server.keeper {
                    keeper.send(KeeperCommand::Up);
                }
            }
            _ => server.clear_control(),
        }
        if !reached {
            return;
        }
    }
}

/// One look at the gateway: status, tools/list, status again.
#[derive(Default)]
struct Observation {
    not_live: Vec<String>,
    phantoms: Vec<String>,
    missing: Vec<String>,
    pid_mismatch: Vec<String>,
    exact: bool,
}

fn observe(
    servers: &[Arc<Server>],
    before: &[ServerStatus],
    listed: &[String],
    after: &[ServerStatus],
    expected: &BTreeSet<String>,
) -> Observation {
    let mut seen = Observation::default();
    let live =
        |statuses: &[ServerStatus], name: &str| statuses.iter().any(|s| s.name == name && s.live());
    let listed_set: BTreeSet<&String> = listed.iter().collect();
    for server in servers {
        let (was, is) = (live(before, &server.name), live(after, &server.name));
        let prefix = format!("{}__", server.name);
        let mine: Vec<&String> = listed.iter().filter(|t| t.starts_with(&prefix)).collect();
        if !(was && is) {
            let state = after
                .iter()
                .find(|s| s.name == server.name)
                .map_or("not reported", |s| s.state.as_str());
            seen.not_live.push(format!("{} ({state})", server.name));
        }
        if !was && !is {
            seen.phantoms.extend(mine.iter().map(|t| t.to_string()));
        }
        if was && is {
            for tool in ToolKind::ALL {
                let name = format!("{prefix}{}", tool.name());
                if !listed_set.contains(&name) {
                    seen.missing.push(name);
                }
            }
            if server.transport == Transport::Stdio {
                let reported = after
                    .iter()
                    .find(|s| s.name == server.name)
                    .and_then(|s| s.pid);
                if reported.is_none() || reported != server.pid() {
                    seen.pid_mismatch.push(format!(
                        "{} (status pid {reported:?}, live fixture {:?})",
                        server.name,
                        server.pid()
                    ));
                }
            }
        }
    }
    // Tools of servers that do not exist at all.
    seen.phantoms.extend(
        listed
            .iter()
            .filter(|t| {
                !servers
                    .iter()
                    .any(|s| t.starts_with(&format!("{}__", s.name)))
            })
            .cloned(),
    );
    seen.exact = listed_set.len() == listed.len()
        && listed.len() == expected.len()
        && listed.iter().all(|t| expected.contains(t));
    seen
}

/// Waits until every server is live with exactly its tools listed (twice in a row), or
/// `within` passes; keeps the last observation.
async fn settle(
    admin: &Admin,
    peer: &Peer<RoleClient>,
    servers: &[Arc<Server>],
    expected: &BTreeSet<String>,
    within: Duration,
) -> Settle {
    let start = Instant::now();
    let mut settle = Settle {
        within,
        servers: servers.len(),
        ..Settle::default()
    };
    let mut good_in_a_row = 0;
    loop {
        let looked = async {
            let before = admin.status().await?;
            let listed = clients::list(peer).await.map_err(anyhow::Error::msg)?;
            let after = admin.status().await?;
            anyhow::Ok(observe(servers, &before, &listed, &after, expected))
        }
        .await;
        let out_of_time = start.elapsed() > within;
        match looked {
            Ok(seen) => {
                let good = seen.exact
                    && seen.not_live.is_empty()
                    && seen.phantoms.is_empty()
                    && seen.missing.is_empty()
                    && seen.pid_mismatch.is_empty();
                good_in_a_row = if good { good_in_a_row + 1 } else { 0 };
                let done = good_in_a_row >= 2 || out_of_time;
                if done {
                    if good_in_a_row >= 2 {
                        settle.settled_after = Some(start.elapsed());
                    }
                    settle.not_live = seen.not_live;
                    settle.phantoms = seen.phantoms;
                    settle.missing = seen.missing;
                    settle.pid_mismatch = seen.pid_mismatch;
                    return settle;
                }
                settle.transient_phantoms += seen.phantoms.len();
            }
            Err(error) => {
                if settle.errors.len() < 5 {
                    settle.errors.push(error.to_string());
                }
                if out_of_time {
                    return settle;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Calls every server's `echo` through the gateway until it answers (breakers may still be
/// open for a moment), within the settle time.
async fn verify(
    calls: &Calls,
    peer: &Peer<RoleClient>,
    servers: &[Arc<Server>],
    settle: &mut Settle,
) {
    let by = Instant::now() + settle.within.max(Duration::from_secs(10));
    for server in servers {
        let advertised = format!("{}__echo", server.name);
        let answered = loop {
            let outcome = calls
                .call(peer, None, &server.name, ToolKind::Echo, &advertised)
                .await;
            if outcome == Outcome::Ok {
                break true;
            }
            if Instant::now() > by {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        if answered {
            settle.verified += 1;
        } else {
            settle.unverified.push(server.name.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(name: &str) -> Arc<Server> {
        Arc::new(Server {
            name: name.into(),
            transport: Transport::Http,
            state: PathBuf::from("/nonexistent"),
            keeper: None,
        })
    }

    fn status(name: &str, state: &str) -> ServerStatus {
        ServerStatus {
            name: name.into(),
            state: state.into(),
            pid: None,
            tools: 3,
        }
    }

    /// A server's tools in name order (the order `all` below lists them in).
    fn tools(server: &str) -> Vec<String> {
        let mut names: Vec<String> = ToolKind::ALL
            .iter()
            .map(|t| format!("{server}__{}", t.name()))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn phantoms_are_tools_of_servers_without_a_session_before_and_after_the_listing() {
        let servers = [server("a"), server("b"), server("c")];
        let expected: BTreeSet<String> = ["a", "b", "c"].iter().flat_map(|s| tools(s)).collect();
        let all: Vec<String> = expected.iter().cloned().collect();
        let healthy = [
            status("a", "healthy"),
            status("b", "connected"),
            status("c", "healthy"),
        ];
        let seen = observe(&servers, &healthy, &all, &healthy, &expected);
        assert!(seen.exact && seen.phantoms.is_empty() && seen.missing.is_empty());
        assert!(seen.not_live.is_empty());

        // b lost its session before the listing and has none after it, yet its tools are listed.
        let b_down = [
            status("a", "healthy"),
            status("b", "backing-off"),
            status("c", "healthy"),
        ];
        let seen = observe(&servers, &b_down, &all, &b_down, &expected);
        assert_eq!(seen.phantoms, tools("b"));
        assert_eq!(seen.not_live, vec!["b (backing-off)".to_string()]);

        // A change during the listing is not a phantom: b came back between the two looks.
        let seen = observe(&servers, &b_down, &all, &healthy, &expected);
        assert!(seen.phantoms.is_empty());

        // c is live throughout but its tools are not listed; a tool of no server is a phantom.
        let mut listed: Vec<String> = all
            .iter()
            .filter(|t| !t.starts_with("c__"))
            .cloned()
            .collect();
        listed.push("ghost__echo".into());
        let seen = observe(&servers, &healthy, &listed, &healthy, &expected);
        let mut missing = seen.missing.clone();
        missing.sort();
        assert_eq!(missing, tools("c"));
        assert_eq!(seen.phantoms, vec!["ghost__echo".to_string()]);
        assert!(!seen.exact);
    }
}
