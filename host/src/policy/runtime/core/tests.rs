//! The core driven by hand, as a driver would, with the real embedded default policy: no
//! thread, no lock, no clock.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::*;
use crate::policy::types::{ServerConfig, SessionInfo, Tool, TransportKind};

fn core_with(limits: Limits, inline_fuel: u64) -> (PolicyCore, Arc<RuntimeStats>) {
    core_checkpointing(limits, inline_fuel, 4)
}

fn core_checkpointing(
    limits: Limits,
    inline_fuel: u64,
    checkpoint_every: usize,
) -> (PolicyCore, Arc<RuntimeStats>) {
    let engine = PolicyEngine::new(None).expect("an engine");
    let policy = engine
        .load(&PolicySource::Embedded)
        .expect("the default policy");
    let stats = Arc::new(RuntimeStats::default());
    let core = PolicyCore::start(
        engine,
        stats.clone(),
        policy,
        CoreOptions {
            settings: "{}".into(),
            limits,
            fallback_to_default: true,
            checkpoint_every,
            inline_fuel,
            recording: true,
        },
    )
    .expect("the default policy starts");
    (core, stats)
}

fn event(now: Millis, kind: EventKind) -> Input {
    Input::Event(Event { now, kind })
}

fn configured(name: &str) -> EventKind {
    EventKind::ServerConfigured(ServerConfig {
        name: name.into(),
        transport: TransportKind::Stdio,
        include: vec![],
        exclude: vec![],
        settings: String::new(),
        prefix: None,
    })
}

fn connected(name: &str, tools: usize) -> EventKind {
    EventKind::Connected(SessionInfo {
        server: name.into(),
        server_info: "fixture 1.0".into(),
        tools: (0..tools)
            .map(|i| Tool {
                name: format!("tool_{i}"),
                description: Some(format!("tool number {i}")),
                input_schema: r#"{"type":"object"}"#.into(),
                extra: String::new(),
                read_only: false,
            })
            .collect(),
    })
}

fn state_of(core: &mut PolicyCore, server: &str, now: Millis) -> ServerState {
    let status = core.status(now).expect("status");
    status
        .into_iter()
        .find(|s| s.server == server)
        .map(|s| s.state)
        .expect("the server is known")
}

#[test]
fn events_are_decided_into_actions_and_every_decision_is_left_in_the_outbox() {
    let (mut core, stats) = core_with(Limits::default(), 0);
    let started = core.take_outbox();
    assert!(matches!(started.records[..], [Record::Policy { .. }]));
    assert!(started.running.is_some());

    let actions = core
        .step(event(10, configured("a")))
        .unwrap()
        .into_actions();
    assert!(
        actions.contains(&Action::Connect("a".into())),
        "{actions:?}"
    );
    let actions = core
        .step(event(20, connected("a", 2)))
        .unwrap()
        .into_actions();
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::PublishTools(p) if p.server == "a")),
        "{actions:?}"
    );
    assert_eq!(state_of(&mut core, "a", 30), ServerState::Connected);

    let outbox = core.take_outbox();
    assert_eq!(
        outbox.records.len(),
        2,
        "two events recorded, status is not"
    );
    assert!(outbox.notices.is_empty());
    assert!(core.take_outbox().is_empty(), "taking empties it");
    assert_eq!(stats.decisions.load(Ordering::Relaxed), 3);
    assert_eq!(core.last_now(), 20);
}

#[test]
fn the_journal_since_the_last_snapshot_stays_bounded() {
    let (mut core, _) = core_with(Limits::default(), 0);
    for (i, server) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
        core.step(event(i as Millis, configured(server))).unwrap();
    }
    // Status requests are not journaled.
    let journaled = core.last_good.journal.len();
    core.status(10).unwrap();
    assert_eq!(core.last_good.journal.len(), journaled);
    // However many inputs come, the journal never outgrows the snapshot by much.
    for i in 0..2000 {
        core.step(event(20 + i, configured("a"))).unwrap();
        let bound = 4.max(core.last_good.snapshot.len() / 32 + 1);
        assert!(core.last_good.journal.len() <= bound, "{i}");
    }
}

#[test]
fn a_larger_state_is_snapshotted_less_often_so_an_input_pays_the_same() {
    let every = super::super::journal::DEFAULT_CHECKPOINT_EVERY;
    let (mut core, _) = core_checkpointing(Limits::default(), 0, every);
    // 40 servers of 20 tools: a state well over `every` inputs' weight.
    let mut now = 0;
    for i in 0..40 {
        let server = format!("server-{i}");
        core.step(event(now, configured(&server))).unwrap();
        core.step(event(now + 1, connected(&server, 20))).unwrap();
        now += 2;
    }
    // Inputs that change little, counted from one checkpoint (the journal emptied) to the next.
    let mut step = |core: &mut PolicyCore| {
        let before = core.last_good.journal.len();
        now += 1;
        core.step(event(now, configured("server-0"))).unwrap();
        core.last_good.journal.len() < before
    };
    let mut guard = 0;
    while !step(&mut core) {
        guard += 1;
        assert!(guard < 100_000, "a first checkpoint");
    }
    let snapshot = core.last_good.snapshot.len();
    assert!(snapshot > every * 32, "{snapshot} bytes");
    let mut inputs = 1;
    while !step(&mut core) {
        inputs += 1;
        assert!(inputs < 100_000, "a second checkpoint");
    }
    assert!(
        inputs > every && inputs >= snapshot / 32,
        "{inputs} inputs between snapshots of a {snapshot}-byte state"
    );
}

#[test]
fn a_decision_over_the_inline_budget_is_given_back_and_decided_in_full() {
    let (mut core, stats) = core_with(Limits::default(), 200);
    assert!(core.decides_inline());
    let missed = core
        .step_inline(event(1, configured("a")))
        .expect_err("200 units decide nothing");
    assert!(
        !core.decides_inline(),
        "the policy thread decides until the redo"
    );
    let (input, miss) = *missed;
    assert!(matches!(miss, InlineMiss::OverBudget), "{miss:?}");
    let actions = core.redo(input, miss).unwrap().into_actions();
    assert!(actions.contains(&Action::Connect("a".into())));
    assert!(core.decides_inline(), "only that decision was heavy");
    assert_eq!(stats.inline_misses.load(Ordering::Relaxed), 1);
    assert_eq!(stats.faults.load(Ordering::Relaxed), 0);
    // The instance the inline attempt left mid-call was rebuilt: the state holds "a" once.
    assert_eq!(state_of(&mut core, "a", 2), ServerState::Connecting);
}

#[test]
fn an_input_that_faults_on_a_fresh_instance_too_is_refused_and_the_last_good_state_stays() {
    // Enough fuel for small decisions and none per byte of tool data: a long tool list runs out.
    let limits = Limits {
        fuel_per_call: 3_000_000,
        fuel_per_data_byte: 0,
        ..Limits::default()
    };
    let (mut core, stats) = core_with(limits, 0);
    core.take_outbox();
    core.step(event(1, configured("a"))).unwrap();

    let error = core.step(event(2, connected("a", 5_000))).unwrap_err();
    assert!(
        matches!(
            error,
            PolicyError::Fault {
                fault: PolicyFault::OutOfFuel(_),
                ..
            }
        ),
        "{error}"
    );
    let notices = core.take_outbox().notices;
    assert!(
        matches!(
            notices[..],
            [
                PolicyNotice::Fault { .. },
                PolicyNotice::Recovered { .. },
                PolicyNotice::Fault { .. }
            ]
        ),
        "{notices:?}"
    );
    assert_eq!(stats.faults.load(Ordering::Relaxed), 2);
    assert_eq!(stats.recoveries.load(Ordering::Relaxed), 1);
    // The embedded default cannot fall back to itself; the refused session never happened.
    assert_eq!(core.running().label, PolicySource::Embedded.label());
    assert_eq!(state_of(&mut core, "a", 3), ServerState::Connecting);
    let actions = core
        .step(event(4, connected("a", 3)))
        .unwrap()
        .into_actions();
    assert!(actions.iter().any(|a| matches!(a, Action::PublishTools(_))));
}

#[test]
fn a_swap_to_another_build_of_the_same_policy_carries_the_state_by_snapshot() {
    let (mut core, stats) = core_with(Limits::default(), 0);
    core.step(event(1, configured("a"))).unwrap();
    core.step(event(2, connected("a", 1))).unwrap();
    core.take_outbox();

    let same = core.engine.load(&PolicySource::Embedded).unwrap();
    let report = core.swap(same, 3).unwrap();
    assert_eq!(report.path, swap::SwapPath::Snapshot);
    assert!(report.not_carried.is_empty(), "{:?}", report.not_carried);
    assert!(
        !report.actions.contains(&Action::Connect("a".into())),
        "a live session is kept"
    );
    assert_eq!(state_of(&mut core, "a", 4), ServerState::Connected);
    assert_eq!(stats.swaps.load(Ordering::Relaxed), 1);
    let outbox = core.take_outbox();
    assert!(matches!(outbox.notices[..], [PolicyNotice::Swapped { .. }]));
    assert!(
        outbox
            .records
            .iter()
            .any(|r| matches!(r, Record::Policy { .. })),
        "the recording notes who decides from here"
    );
}

#[test]
fn a_shadow_of_the_same_policy_follows_every_decision_and_agrees() {
    let (mut core, _) = core_with(Limits::default(), 1_000_000);
    core.step(event(1, configured("a"))).unwrap();
    let same = core.engine.load(&PolicySource::Embedded).unwrap();
    let report = core.start_shadow(same, 2).unwrap();
    assert_eq!(report.decisions, 0);
    assert!(
        !core.decides_inline(),
        "a shadow decides on the policy thread only"
    );

    core.step(event(3, connected("a", 2))).unwrap();
    core.step(event(4, configured("b"))).unwrap();
    let report = core.shadow_report().expect("a shadow runs");
    assert_eq!((report.decisions, report.divergences), (2, 0));

    assert!(core.drop_shadow());
    assert!(!core.drop_shadow());
    assert!(core.decides_inline());
    let notices = core.take_outbox().notices;
    assert!(
        matches!(
            notices[..],
            [
                PolicyNotice::ShadowStarted { .. },
                PolicyNotice::ShadowDropped { .. }
            ]
        ),
        "{notices:?}"
    );
}

#[test]
fn lifecycle_events_of_a_policy_holding_many_tools_go_to_the_policy_thread_and_call_reports_do_not()
{
    let (mut core, _) = core_with(Limits::default(), 0);
    let report = |now| {
        event(
            now,
            EventKind::CallFinished(crate::policy::types::CallReport {
                server: "a".into(),
                call_id: 1,
                outcome: crate::policy::types::CallOutcome::Ok,
                duration_ms: 1,
            }),
        )
    };
    assert!(!core.is_heavy(&event(1, configured("b"))));
    for (i, server) in ["a", "c", "d", "e"].into_iter().enumerate() {
        core.step(event(2 + i as Millis, configured(server)))
            .unwrap();
        // Each list is light on its own; together they are not.
        core.step(event(10 + i as Millis, connected(server, 100)))
            .unwrap();
    }
    assert!(
        core.instance.held().total() > INLINE_TOOL_DATA,
        "{}",
        core.instance.held().total()
    );
    assert!(core.is_heavy(&event(20, configured("b"))));
    assert!(!core.is_heavy(&report(21)));
}
