//! Supervision logic in virtual time: the real supervisor and the real default policy (a wasm
//! component), with a fake connector instead of processes and sockets, under tokio's paused
//! clock. Backoff, keepalive and parking schedules are asserted to the millisecond, however
//! loaded the machine; minutes of policy time pass instantly. What only real processes show
//! (reaping, process groups, pipes) stays in `supervision_stdio`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use tether::catalog::ServerCatalog;
use tether::config::{ServerSpec, Timeouts};
use tether::policy::{
    Fault, PolicyRuntime, PolicySource, RuntimeOptions, ServerState, Tool, TransportKind,
};
use tether::supervisor::{Attempt, Connector, Link, OpenRequest, Opened, Supervisor};
use tether::upstream::{KeepaliveFailure, Session};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::common::*;

/// What the fake server does on the next connection attempt.
#[derive(Clone)]
enum Plan {
    /// The attempt fails: the server cannot be reached.
    Refuse,
    /// A session opens with these tools; keepalives are answered, or never (`hangs`).
    Serve {
        tools: Vec<&'static str>,
        hangs: bool,
    },
    /// A session whose process dies during its first keepalive: the keepalive fails at once on
    /// a closed transport, and the session's end (exit code 7) settles a few milliseconds later.
    DiesOnKeepalive,
}

/// A scripted server: its plans, when it was attempted, its live session.
struct FakeServer {
    plans: Mutex<VecDeque<Plan>>,
    attempts: Mutex<Vec<Instant>>,
    keepalives: Mutex<Vec<Instant>>,
    /// The next this many keepalives, on whichever session, are answered with HTTP 502.
    bad_gateways: Mutex<u32>,
    live: Mutex<Option<Arc<FakeLink>>>,
}

impl FakeServer {
    fn new(plans: &[Plan]) -> Arc<Self> {
        Arc::new(Self {
            plans: Mutex::new(plans.iter().cloned().collect()),
            attempts: Mutex::default(),
            keepalives: Mutex::default(),
            bad_gateways: Mutex::default(),
            live: Mutex::default(),
        })
    }

    /// Ends the live session with `fault`, as a dying process would.
    fn kill(&self, fault: Fault) {
        let link = self.live.lock().unwrap().take().expect("a live session");
        link.end(fault);
    }

    fn attempts_since(&self, start: Instant) -> Vec<u64> {
        self.attempts
            .lock()
            .unwrap()
            .iter()
            .map(|at| (*at - start).as_millis() as u64)
            .collect()
    }
}

struct FakeConnector(Arc<FakeServer>);

impl Connector for FakeConnector {
    fn open(&self, request: OpenRequest) -> Attempt {
        let server = self.0.clone();
        async move {
            server.attempts.lock().unwrap().push(Instant::now());
            let plan = server
                .plans
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Plan::Refuse);
            let result = match plan {
                Plan::Refuse => Err(Fault::HandshakeTimedOut),
                plan @ (Plan::Serve { .. } | Plan::DiesOnKeepalive) => {
                    let dies = matches!(plan, Plan::DiesOnKeepalive);
                    let (tools, hangs) = match plan {
                        Plan::Serve { tools, hangs } => (tools, hangs),
                        _ => (vec!["echo"], false),
                    };
                    let link = Arc::new(FakeLink {
                        server: server.clone(),
                        end: watch::channel(None).0,
                        hangs,
                        dies,
                        closed: AtomicBool::new(false),
                        tools: tools.iter().map(|t| tether_tests::tool(t)).collect(),
                    });
                    *server.live.lock().unwrap() = Some(link.clone());
                    Ok(Opened {
                        tools: link.tools.clone(),
                        link,
                        catalog: ServerCatalog::default(),
                    })
                }
            };
            (result, request.remembered)
        }
        .boxed()
    }
}

struct FakeLink {
    server: Arc<FakeServer>,
    end: watch::Sender<Option<Fault>>,
    hangs: bool,
    dies: bool,
    /// The transport closed (the end is settling).
    closed: AtomicBool,
    tools: Vec<Tool>,
}

impl FakeLink {
    fn end(&self, fault: Fault) {
        self.end.send_if_modified(|end| {
            let first = end.is_none();
            if first {
                *end = Some(fault);
            }
            first
        });
    }
}

impl Link for FakeLink {
    fn server_info(&self) -> String {
        "fake 1.0".into()
    }
    fn pid(&self) -> Option<u32> {
        None
    }
    fn transport(&self) -> TransportKind {
        TransportKind::Stdio
    }
    fn is_alive(&self) -> bool {
        self.end.borrow().is_none() && !self.closed.load(Ordering::SeqCst)
    }
    fn ended(&self) -> BoxFuture<'_, Fault> {
        let mut end = self.end.subscribe();
        async move {
            let settled = end
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|f| f.clone());
            match settled {
                Some(fault) => fault,
                None => std::future::pending().await,
            }
        }
        .boxed()
    }
    fn recorded_end(&self) -> Option<Fault> {
        self.end.borrow().clone()
    }
    fn keepalive<'a>(
        &'a self,
        timeouts: &'a Timeouts,
    ) -> BoxFuture<'a, Result<(), KeepaliveFailure>> {
        async move {
            self.server.keepalives.lock().unwrap().push(Instant::now());
            let bad_gateway = {
                let mut left = self.server.bad_gateways.lock().unwrap();
                let bad = *left > 0;
                *left = left.saturating_sub(1);
                bad
            };
            if bad_gateway {
                return Err(KeepaliveFailure::HttpStatus(Fault::KeepaliveFailed(
                    "HTTP 502 Bad Gateway".into(),
                )));
            }
            if self.dies {
                self.closed.store(true, Ordering::SeqCst);
                let end = self.end.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    end.send_if_modified(|end| {
                        end.replace(Fault::ProcessExited(Some(7))).is_none()
                    });
                });
                return Err(KeepaliveFailure::Unanswered(Fault::KeepaliveFailed(
                    "connection closed".into(),
                )));
            }
            if self.hangs {
                tokio::time::sleep(timeouts.keepalive_deadline).await;
                return Err(KeepaliveFailure::Unanswered(Fault::KeepaliveFailed(
                    "no answer".into(),
                )));
            }
            Ok(())
        }
        .boxed()
    }
    fn list_tools<'a>(&'a self, _: &'a Timeouts) -> BoxFuture<'a, Result<Vec<Tool>, Fault>> {
        async move { Ok(self.tools.clone()) }.boxed()
    }
    fn list_catalog<'a>(&'a self, _: &'a Timeouts) -> BoxFuture<'a, Result<ServerCatalog, Fault>> {
        async move { Ok(ServerCatalog::default()) }.boxed()
    }
    fn close(&self, _: Duration) -> BoxFuture<'_, ()> {
        self.end(Fault::TransportClosed("closed by Tether".into()));
        async {}.boxed()
    }
    fn session(self: Arc<Self>) -> Option<Arc<Session>> {
        None
    }
}

/// A supervisor on the default policy with `settings` and one fake server named `svc`.
fn supervise(settings: &str, server: &Arc<FakeServer>, interval: Duration) -> Supervisor {
    supervise_with(PolicySource::Embedded, settings, server, interval)
}

/// [`supervise`], on the policy `source`.
fn supervise_with(
    source: PolicySource,
    settings: &str,
    server: &Arc<FakeServer>,
    interval: Duration,
) -> Supervisor {
    test_logging();
    let policy = PolicyRuntime::start(RuntimeOptions {
        source,
        settings: settings.into(),
        engine: Some(shared_engine()),
        ..RuntimeOptions::default()
    })
    .expect("policy starts");
    let supervisor = Supervisor::start_with(
        policy,
        std::env::temp_dir(),
        Arc::new(FakeConnector(server.clone())),
    );
    let mut spec = ServerSpec::stdio("svc", "unused", &[]);
    spec.timeouts = test_timeouts();
    spec.timeouts.keepalive_interval = interval;
    supervisor.add_server(spec).unwrap();
    supervisor
}

/// Waits (in virtual time) until `svc` is in `state`; answers when it got there.
async fn reaches(supervisor: &Supervisor, state: ServerState) -> Instant {
    let mut lifecycle = supervisor.lifecycle();
    if supervisor.views()[0].state == state {
        return Instant::now();
    }
    tokio::time::timeout(Duration::from_secs(3600), async {
        loop {
            let event = lifecycle.recv().await.expect("the supervisor runs");
            if event.state == state {
                return Instant::now();
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("svc never reached {state:?}"))
}

fn tools(supervisor: &Supervisor) -> Vec<String> {
    supervisor.registry().server_tools("svc")
}

fn serve(tools: &[&'static str]) -> Plan {
    Plan::Serve {
        tools: tools.to_vec(),
        hangs: false,
    }
}

#[tokio::test(start_paused = true)]
async fn a_dead_session_is_withdrawn_at_once_and_retried_on_the_backoff_schedule() {
    let server = FakeServer::new(&[
        serve(&["echo"]),
        Plan::Refuse,
        Plan::Refuse,
        Plan::Refuse,
        serve(&["echo"]),
    ]);
    // base 20 ms, doubling, cap 100 ms, no jitter.
    let supervisor = supervise(FAST_POLICY, &server, Duration::from_secs(3600));
    reaches(&supervisor, ServerState::Connected).await;
    assert_eq!(tools(&supervisor), ["svc__echo"]);

    let killed = Instant::now();
    server.kill(Fault::ProcessExited(Some(1)));
    reaches(&supervisor, ServerState::BackingOff).await;
    assert_eq!(Instant::now(), killed, "withdrawn in the same instant");
    assert!(tools(&supervisor).is_empty(), "no phantom tools");

    reaches(&supervisor, ServerState::Connected).await;
    assert_eq!(tools(&supervisor), ["svc__echo"]);
    // The first attempt at start, then 20, 20+40, 20+40+80, 20+40+80+100 ms after the death.
    let attempts = server.attempts_since(killed);
    assert_eq!(attempts[1..], [20, 60, 140, 240], "{attempts:?}");
    supervisor.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn keepalives_prove_a_session_early_and_one_unanswered_ends_it() {
    let server = FakeServer::new(&[
        serve(&["echo"]),
        Plan::Serve {
            tools: vec!["echo"],
            hangs: true,
        },
        serve(&[]),
    ]);
    let interval = Duration::from_secs(60);
    let supervisor = supervise(FAST_POLICY, &server, interval);
    let connected = reaches(&supervisor, ServerState::Connected).await;
    // The first keepalive 5 s after connecting proves the session; then one a minute.
    let proven = reaches(&supervisor, ServerState::Healthy).await;
    assert_eq!(proven - connected, Timeouts::KEEPALIVE_FLOOR);
    tokio::time::sleep(interval * 3 + Duration::from_secs(1)).await;
    let keepalives: Vec<u64> = server
        .keepalives
        .lock()
        .unwrap()
        .iter()
        .map(|at| (*at - connected).as_secs())
        .collect();
    assert_eq!(keepalives, [5, 65, 125, 185]);

    // The next session never answers: it ends, and its tools go, the moment its first probe's
    // deadline passes; no wait for an end that a frozen session never shows.
    server.kill(Fault::ProcessExited(Some(1)));
    let second = reaches(&supervisor, ServerState::Connected).await;
    let ended = reaches(&supervisor, ServerState::BackingOff).await;
    assert_eq!(
        ended - second,
        Timeouts::KEEPALIVE_FLOOR + test_timeouts().keepalive_deadline
    );
    assert!(tools(&supervisor).is_empty());
    let fault = supervisor.views()[0].last_fault.clone().unwrap_or_default();
    assert!(fault.contains("no answer"), "{fault}");
    reaches(&supervisor, ServerState::Connected).await;
    supervisor.shutdown().await;
}

/// A keepalive a proxy answers with HTTP 502 (its server restarting behind it) costs the
/// session nothing if the next one, asked a few seconds later, is answered; two in a row end it.
#[tokio::test(start_paused = true)]
async fn a_keepalive_answered_with_an_http_error_is_asked_again_and_two_in_a_row_end_the_session() {
    let server = FakeServer::new(&[serve(&["echo"]), serve(&["echo"]), serve(&["echo"])]);
    *server.bad_gateways.lock().unwrap() = 1;
    let interval = Duration::from_secs(60);
    let supervisor = supervise(FAST_POLICY, &server, interval);
    let connected = reaches(&supervisor, ServerState::Connected).await;
    // The first keepalive (at the floor) failed; the one after it, the floor later, proves
    // the same session.
    let proven = reaches(&supervisor, ServerState::Healthy).await;
    assert_eq!(proven - connected, Timeouts::KEEPALIVE_FLOOR * 2);
    assert_eq!(server.attempts.lock().unwrap().len(), 1, "no new session");
    assert_eq!(tools(&supervisor), ["svc__echo"]);
    let fault = supervisor.views()[0].last_fault.clone().unwrap_or_default();
    assert!(fault.contains("HTTP 502"), "the policy heard: {fault}");

    *server.bad_gateways.lock().unwrap() = 2;
    let ended = reaches(&supervisor, ServerState::BackingOff).await;
    assert_eq!(ended - proven, interval + Timeouts::KEEPALIVE_FLOOR);
    assert!(tools(&supervisor).is_empty(), "no phantom tools");
    reaches(&supervisor, ServerState::Connected).await;
    assert_eq!(server.attempts.lock().unwrap().len(), 2);
    supervisor.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_server_that_never_answers_parks_after_its_budget_and_its_self_probe_revives_it() {
    let mut plans = vec![Plan::Refuse; 4];
    plans.push(serve(&["echo"]));
    let server = FakeServer::new(&plans);
    let supervisor = supervise(FAST_POLICY, &server, Duration::from_secs(3600));
    let start = Instant::now();
    let parked = reaches(&supervisor, ServerState::Parked).await;
    // A server never proven gets 4 attempts: at once, then 20, 40 and 80 ms apart.
    assert_eq!(server.attempts_since(start), [0, 20, 60, 140]);
    assert_eq!(parked - start, Duration::from_millis(140));
    assert!(tools(&supervisor).is_empty());

    // Parked: nothing until the self-probe, due in [probe_initial_ms / 2, probe_initial_ms]
    // (150 to 300 ms, jittered), which finds it back.
    let revived = reaches(&supervisor, ServerState::Connected).await;
    let probe = revived - parked;
    assert!(
        (Duration::from_millis(150)..=Duration::from_millis(300)).contains(&probe),
        "{probe:?}"
    );
    assert_eq!(server.attempts.lock().unwrap().len(), 5);
    assert_eq!(tools(&supervisor), ["svc__echo"]);
    supervisor.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn virtual_time_makes_the_schedule_exactly_repeatable() {
    // Two runs of the same script see the same attempts at the same times, to the millisecond,
    // jitter included (the policy's generator is seeded).
    let mut runs = Vec::new();
    for _ in 0..2 {
        let server = FakeServer::new(&vec![Plan::Refuse; 12]);
        let supervisor = supervise(
            r#"{"backoff": {"base_ms": 20, "cap_ms": 100, "jitter": "full"},
                "park": {"probe_initial_ms": 300, "probe_max_ms": 600}}"#,
            &server,
            Duration::from_secs(3600),
        );
        let start = Instant::now();
        tokio::time::sleep(Duration::from_secs(5)).await;
        runs.push(server.attempts_since(start));
        supervisor.shutdown().await;
    }
    assert!(runs[0].len() > 6, "{runs:?}");
    assert_eq!(runs[0], runs[1]);
}

#[tokio::test(start_paused = true)]
async fn a_child_that_dies_during_a_keepalive_is_reported_by_its_exit_code() {
    let server = FakeServer::new(&[Plan::DiesOnKeepalive, serve(&["echo"])]);
    let supervisor = supervise(FAST_POLICY, &server, Duration::from_secs(3600));
    reaches(&supervisor, ServerState::Connected).await;
    reaches(&supervisor, ServerState::BackingOff).await;
    let fault = supervisor.views()[0].last_fault.clone().unwrap_or_default();
    assert!(
        fault.contains("code 7"),
        "the exit, not the keepalive: {fault}"
    );
    reaches(&supervisor, ServerState::Connected).await;
    supervisor.shutdown().await;
}

/// What changes nothing is absorbed: the fixed-interval test policy withdraws a server's tools
/// on every failure, shown or not. Nothing is broadcast for a withdrawal of nothing (so agents
/// hear no `tools/list_changed`); each is counted.
#[tokio::test(start_paused = true)]
async fn withdrawals_of_nothing_announce_nothing_and_are_counted() {
    let mut plans = vec![serve(&["echo", "read"])];
    plans.extend(vec![Plan::Refuse; 5]);
    plans.push(serve(&["echo", "read"]));
    let server = FakeServer::new(&plans);
    let fixed = tether_tests::component(tether_tests::components::FIXED_INTERVAL);
    let supervisor = supervise_with(fixed, "{}", &server, Duration::from_secs(3600));
    reaches(&supervisor, ServerState::Connected).await;
    assert_eq!(tools(&supervisor), ["svc__echo", "svc__read"]);
    let mut changes = supervisor.registry().subscribe();
    let generation = supervisor.registry().generation();

    // The session dies: one withdrawal that hides the tools, then one per failed attempt (one
    // a second, five of them) that hides nothing; then the tools come back.
    let killed = Instant::now();
    server.kill(Fault::ProcessExited(Some(1)));
    reaches(&supervisor, ServerState::BackingOff).await;
    assert!(tools(&supervisor).is_empty());
    reaches(&supervisor, ServerState::Connected).await;
    assert_eq!(
        server.attempts_since(killed)[1..],
        [1000, 2000, 3000, 4000, 5000, 6000]
    );
    assert_eq!(tools(&supervisor), ["svc__echo", "svc__read"]);
    assert_eq!(supervisor.redundant_actions(), 5);
    let seen: Vec<(Vec<String>, Vec<String>)> = std::iter::from_fn(|| changes.try_recv().ok())
        .map(|change| (change.added, change.removed))
        .collect();
    let both = vec!["svc__echo".to_string(), "svc__read".to_string()];
    assert_eq!(seen, [(vec![], both.clone()), (both, vec![])]);
    assert_eq!(supervisor.registry().generation(), generation + 2);
    let metrics = tether::metrics::Metrics::new().render(&supervisor).await;
    assert!(
        metrics.contains("tether_policy_redundant_actions_total 5"),
        "{metrics}"
    );
    supervisor.shutdown().await;
}
