//! One server's lifecycle as the host runs it, sans IO: what the server's task observed (an
//! order from the policy, an attempt's outcome, a session's end, a keepalive's answer, a list
//! change) and the host's time go in; what to do comes out as [`Effect`]s, which the task
//! (`task.rs`) carries out with real or fake sessions. No clocks, no futures, no sessions here:
//! every rule of "when to probe, what to tell the policy, what to drop" is a plain function,
//! tested natively below.

use crate::policy::types::Millis;
use crate::policy::{EventKind, Fault, ServerFault, ServerTools, TimerFired, Tool};
use crate::upstream::KeepaliveFailure;

/// What a server's task observed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Input {
    /// The policy asks for a (new) session.
    Connect,
    /// The policy asks to drop the session or attempt.
    Disconnect,
    /// The policy asks to be woken at `at` with `token` (replacing an earlier request).
    WakeAt { at: Millis, token: u64 },
    /// The policy failed to take the session that just opened.
    PolicyRefusedSession(String),
    /// The connection attempt opened a session (the task holds it).
    Opened,
    /// The connection attempt failed.
    AttemptFailed(Fault),
    /// The session ended, for this reason.
    Ended(Fault),
    /// The keepalive answered; on failure, `recorded_end` is what ended the session, if the
    /// transport saw it (an HTTP 404 says more than the keepalive's failure).
    KeepaliveDone {
        result: Result<(), KeepaliveFailure>,
        recorded_end: Option<Fault>,
    },
    /// The server announced that its lists changed.
    ListsChanged { tools: bool, catalog: bool },
    /// The tool list was read again.
    ToolsListed(Result<Vec<Tool>, Fault>),
    /// Prompts, resources and templates were read again (the task stores them, or logs why
    /// not: the last lists stay); `failed`: the session did not give them.
    CatalogListed { failed: bool },
    /// The time of [`Lifecycle::deadline`] has come.
    Tick,
}

/// What the task must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Effect {
    /// Close the session: the keepalive and list reads on it are dropped, calls stop seeing
    /// it, its process is stopped.
    CloseSession,
    /// Start a connection attempt, with fresh tracking of list changes.
    StartAttempt,
    /// Drop the attempt in flight.
    DropAttempt,
    /// Adopt the opened session and tell the policy it is `connected`.
    AdoptSession,
    /// Send the keepalive.
    StartKeepalive,
    /// Read the tool list again.
    RefreshTools,
    /// Read prompts, resources and templates again.
    RefreshCatalog,
    /// Tell the policy.
    Feed(EventKind),
    /// Note a fault operators should see, without telling the policy.
    NoteFault(Fault),
}

/// A list refresh: at most one in flight and one more wanted, however many notices come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Refresh {
    #[default]
    Idle,
    Running,
    RunningThenAgain,
}

impl Refresh {
    /// A change was announced: start a refresh, or want one more after the running one.
    fn wanted(&mut self) -> bool {
        match self {
            Refresh::Idle => {
                *self = Refresh::Running;
                true
            }
            Refresh::Running | Refresh::RunningThenAgain => {
                *self = Refresh::RunningThenAgain;
                false
            }
        }
    }

    /// The running refresh finished: whether to start another.
    fn finished(&mut self, live: bool) -> bool {
        let again = *self == Refresh::RunningThenAgain && live;
        *self = if again {
            Refresh::Running
        } else {
            Refresh::Idle
        };
        again
    }
}

/// The keepalive of a live session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keepalive {
    /// Due at this time.
    Due(Millis),
    Running,
}

/// One server's lifecycle (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Lifecycle {
    server: String,
    /// Between keepalives on an idle session.
    keepalive_interval: Millis,
    /// The first keepalive of a session comes this soon: it proves the session (and resets
    /// the retry budget) without waiting a whole interval.
    first_keepalive: Millis,
    attempting: bool,
    /// `Some` while a session is live.
    keepalive: Option<Keepalive>,
    /// The last keepalive was answered with an HTTP error status or refused: the one now due
    /// or running is the session's last chance. One failed request (a proxy's 502 while the
    /// server restarts) does not cost a session and the calls on it; two in a row do.
    asking_again: bool,
    wake: Option<(Millis, u64)>,
    tools: Refresh,
    catalog: Refresh,
}

impl Lifecycle {
    pub(crate) fn new(server: &str, keepalive_interval: Millis, first_keepalive: Millis) -> Self {
        Self {
            server: server.to_string(),
            keepalive_interval,
            first_keepalive: first_keepalive.min(keepalive_interval),
            attempting: false,
            keepalive: None,
            asking_again: false,
            wake: None,
            tools: Refresh::Idle,
            catalog: Refresh::Idle,
        }
    }

    /// Whether a session is live.
    pub(crate) fn live(&self) -> bool {
        self.keepalive.is_some()
    }

    /// When the task must come back with [`Input::Tick`]: the policy's timer or the next
    /// keepalive, whichever is first.
    pub(crate) fn deadline(&self) -> Option<Millis> {
        let keepalive = match self.keepalive {
            Some(Keepalive::Due(at)) => Some(at),
            _ => None,
        };
        [self.wake.map(|(at, _)| at), keepalive]
            .into_iter()
            .flatten()
            .min()
    }

    fn fault(&self, fault: Fault) -> ServerFault {
        ServerFault {
            server: self.server.clone(),
            fault,
        }
    }

    /// A list the session failed to give: its keepalive comes now, not at its time. A session
    /// the server forgot (some SDKs answer a request on it with 400, as they answer a request
    /// they will not take) then ends at once instead of keeping its tools up until the next
    /// keepalive; one that answers keeps them, and its last lists. A session already being
    /// asked again keeps that time: an error status's wait is its one second chance, and a
    /// list failed with the same status must not spend it.
    fn ask_now(&mut self, now: Millis) {
        if self.asking_again {
            return;
        }
        if let Some(Keepalive::Due(at)) = &mut self.keepalive {
            *at = (*at).min(now);
        }
    }

    /// Ends the session.
    fn close(&mut self, effects: &mut Vec<Effect>) {
        self.tools = Refresh::Idle;
        self.catalog = Refresh::Idle;
        self.asking_again = false;
        if self.keepalive.take().is_some() {
            effects.push(Effect::CloseSession);
        }
    }

    /// What to do about `input`, observed at `now`.
    pub(crate) fn handle(&mut self, input: Input, now: Millis) -> Vec<Effect> {
        let mut effects = Vec::new();
        match input {
            Input::Connect => {
                self.close(&mut effects);
                // A new attempt replaces one in flight.
                self.attempting = true;
                effects.push(Effect::StartAttempt);
            }
            Input::Disconnect => {
                if std::mem::take(&mut self.attempting) {
                    effects.push(Effect::DropAttempt);
                }
                self.close(&mut effects);
            }
            Input::WakeAt { at, token } => self.wake = Some((at, token)),
            Input::PolicyRefusedSession(reason) => {
                self.close(&mut effects);
                effects.push(Effect::Feed(EventKind::ConnectFailed(self.fault(
                    Fault::HandshakeFailed(format!(
                        "the policy could not take the session ({reason})"
                    )),
                ))));
            }
            Input::Opened => {
                self.attempting = false;
                self.keepalive = Some(Keepalive::Due(now + self.first_keepalive));
                effects.push(Effect::AdoptSession);
            }
            Input::AttemptFailed(fault) => {
                self.attempting = false;
                effects.push(Effect::Feed(EventKind::ConnectFailed(self.fault(fault))));
            }
            Input::Ended(fault) => {
                if self.live() {
                    self.close(&mut effects);
                    effects.push(Effect::Feed(EventKind::Disconnected(self.fault(fault))));
                }
            }
            Input::KeepaliveDone {
                result,
                recorded_end,
            } => {
                if self.keepalive != Some(Keepalive::Running) {
                    return effects;
                }
                match result {
                    Ok(()) => {
                        self.asking_again = false;
                        self.keepalive = Some(Keepalive::Due(now + self.keepalive_interval));
                        effects.push(Effect::Feed(EventKind::KeepaliveOk(self.server.clone())));
                    }
                    // The policy hears of the failure, and of no end. An error status (a proxy
                    // whose server restarts) is asked about again when a new session's first
                    // keepalive would be; a refusal at once: the session may be forgotten, and
                    // waiting would only keep its tools up.
                    Err(failure @ (KeepaliveFailure::HttpStatus(_) | KeepaliveFailure::Refused(_)))
                        if !self.asking_again =>
                    {
                        self.asking_again = true;
                        let wait = match failure {
                            KeepaliveFailure::HttpStatus(_) => self.first_keepalive,
                            _ => 0,
                        };
                        self.keepalive = Some(Keepalive::Due(now + wait));
                        let fault = self.fault(failure.fault().clone());
                        effects.push(Effect::Feed(EventKind::KeepaliveFailed(fault)));
                    }
                    Err(failure) => {
                        let fault = self.fault(failure.fault().clone());
                        effects.push(Effect::Feed(EventKind::KeepaliveFailed(fault.clone())));
                        self.close(&mut effects);
                        let fault = match recorded_end {
                            Some(ended) => self.fault(ended),
                            None => fault,
                        };
                        effects.push(Effect::Feed(EventKind::Disconnected(fault)));
                    }
                }
            }
            Input::ListsChanged { tools, catalog } => {
                if !self.live() {
                    return effects;
                }
                if tools && self.tools.wanted() {
                    effects.push(Effect::RefreshTools);
                }
                if catalog && self.catalog.wanted() {
                    effects.push(Effect::RefreshCatalog);
                }
            }
            Input::ToolsListed(result) => {
                if self.tools == Refresh::Idle {
                    return effects;
                }
                match result {
                    Ok(tools) => effects.push(Effect::Feed(EventKind::ToolsChanged(ServerTools {
                        server: self.server.clone(),
                        tools,
                    }))),
                    // The last list stays; the session's end, if it ended, comes separately.
                    Err(fault) => {
                        effects.push(Effect::NoteFault(fault));
                        self.ask_now(now);
                    }
                }
                if self.tools.finished(self.live()) {
                    effects.push(Effect::RefreshTools);
                }
            }
            Input::CatalogListed { failed } => {
                if self.catalog == Refresh::Idle {
                    return effects;
                }
                if failed {
                    self.ask_now(now);
                }
                if self.catalog.finished(self.live()) {
                    effects.push(Effect::RefreshCatalog);
                }
            }
            Input::Tick => {
                if let Some((at, token)) = self.wake
                    && at <= now
                {
                    self.wake = None;
                    effects.push(Effect::Feed(EventKind::Timer(TimerFired {
                        server: self.server.clone(),
                        token,
                    })));
                }
                if let Some(Keepalive::Due(at)) = self.keepalive
                    && at <= now
                {
                    self.keepalive = Some(Keepalive::Running);
                    effects.push(Effect::StartKeepalive);
                }
            }
        }
        effects
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Millis = 30_000;
    const FIRST: Millis = 5_000;

    fn lifecycle() -> Lifecycle {
        Lifecycle::new("files", INTERVAL, FIRST)
    }

    fn fault(what: &str) -> Fault {
        Fault::TransportClosed(what.into())
    }

    fn server_fault(what: &str) -> ServerFault {
        ServerFault {
            server: "files".into(),
            fault: fault(what),
        }
    }

    /// A lifecycle with a live session opened at `at`.
    fn live_at(at: Millis) -> Lifecycle {
        let mut lifecycle = lifecycle();
        assert_eq!(lifecycle.handle(Input::Connect, at), [Effect::StartAttempt]);
        assert_eq!(lifecycle.handle(Input::Opened, at), [Effect::AdoptSession]);
        lifecycle
    }

    #[test]
    fn a_new_session_is_proven_early_then_kept_alive_every_interval() {
        let mut lifecycle = live_at(1_000);
        assert_eq!(lifecycle.deadline(), Some(1_000 + FIRST));
        assert_eq!(lifecycle.handle(Input::Tick, 1_000 + FIRST - 1), []);
        assert_eq!(
            lifecycle.handle(Input::Tick, 1_000 + FIRST),
            [Effect::StartKeepalive]
        );
        assert_eq!(lifecycle.deadline(), None, "one keepalive at a time");
        let answered = lifecycle.handle(
            Input::KeepaliveDone {
                result: Ok(()),
                recorded_end: None,
            },
            7_000,
        );
        assert_eq!(
            answered,
            [Effect::Feed(EventKind::KeepaliveOk("files".into()))]
        );
        assert_eq!(lifecycle.deadline(), Some(7_000 + INTERVAL));
    }

    #[test]
    fn the_first_keepalive_never_waits_longer_than_the_interval() {
        let mut lifecycle = Lifecycle::new("files", 2_000, FIRST);
        lifecycle.handle(Input::Connect, 0);
        lifecycle.handle(Input::Opened, 0);
        assert_eq!(lifecycle.deadline(), Some(2_000));
    }

    #[test]
    fn a_failed_keepalive_reports_what_ended_the_session_and_closes_it() {
        let mut lifecycle = live_at(0);
        lifecycle.handle(
            Input::ListsChanged {
                tools: true,
                catalog: false,
            },
            1,
        );
        lifecycle.handle(Input::Tick, FIRST);
        let effects = lifecycle.handle(
            Input::KeepaliveDone {
                result: Err(KeepaliveFailure::Unanswered(fault("keepalive timed out"))),
                recorded_end: Some(fault("HTTP 404: session expired")),
            },
            FIRST + 10,
        );
        assert_eq!(
            effects,
            [
                Effect::Feed(EventKind::KeepaliveFailed(server_fault(
                    "keepalive timed out"
                ))),
                Effect::CloseSession,
                Effect::Feed(EventKind::Disconnected(server_fault(
                    "HTTP 404: session expired"
                ))),
            ]
        );
        assert!(!lifecycle.live());
        assert_eq!(lifecycle.deadline(), None);
        // The refresh that was running is moot: its answer is ignored.
        assert_eq!(
            lifecycle.handle(Input::ToolsListed(Ok(vec![])), FIRST + 20),
            []
        );
    }

    fn bad_gateway() -> KeepaliveFailure {
        KeepaliveFailure::HttpStatus(fault("HTTP 502"))
    }

    /// A keepalive `answer`ed at `at` on `lifecycle`, whose keepalive was due then.
    fn keepalive_answered(
        lifecycle: &mut Lifecycle,
        at: Millis,
        answer: Result<(), KeepaliveFailure>,
    ) -> Vec<Effect> {
        assert_eq!(lifecycle.deadline(), Some(at));
        assert_eq!(lifecycle.handle(Input::Tick, at), [Effect::StartKeepalive]);
        lifecycle.handle(
            Input::KeepaliveDone {
                result: answer,
                recorded_end: None,
            },
            at,
        )
    }

    #[test]
    fn a_keepalive_answered_with_an_http_error_is_asked_again_before_the_session_goes() {
        let mut lifecycle = live_at(0);
        // Noted, not ended: asked again as soon as a new session would be proven.
        assert_eq!(
            keepalive_answered(&mut lifecycle, FIRST, Err(bad_gateway())),
            [Effect::Feed(EventKind::KeepaliveFailed(server_fault(
                "HTTP 502"
            )))]
        );
        assert!(lifecycle.live());
        // Answered this time: the session is proven and back on its interval; a later error
        // gets its second chance again.
        assert_eq!(
            keepalive_answered(&mut lifecycle, 2 * FIRST, Ok(())),
            [Effect::Feed(EventKind::KeepaliveOk("files".into()))]
        );
        let later = 2 * FIRST + INTERVAL;
        assert_eq!(keepalive_answered(&mut lifecycle, later, Err(bad_gateway())).len(), 1);
        assert!(lifecycle.live());

        // Two in a row: the session goes, with the second failure as its end.
        assert_eq!(
            keepalive_answered(&mut lifecycle, later + FIRST, Err(bad_gateway())),
            [
                Effect::Feed(EventKind::KeepaliveFailed(server_fault("HTTP 502"))),
                Effect::CloseSession,
                Effect::Feed(EventKind::Disconnected(server_fault("HTTP 502"))),
            ]
        );
        assert!(!lifecycle.live());
    }

    #[test]
    fn a_refused_keepalive_is_asked_again_at_once() {
        // A forgotten session (some SDKs answer 400), or a 5xx whose body rmcp's client kept
        // without its status: the next keepalive tells, with no wait that would keep the
        // tools of a forgotten session up.
        let refused = || KeepaliveFailure::Refused(fault("an error naming no request"));
        let mut lifecycle = live_at(0);
        assert_eq!(
            keepalive_answered(&mut lifecycle, FIRST, Err(refused())).len(),
            1
        );
        assert!(lifecycle.live());
        let ended = keepalive_answered(&mut lifecycle, FIRST, Err(refused()));
        assert_eq!(ended[1], Effect::CloseSession);
        assert!(!lifecycle.live());
    }

    #[test]
    fn an_unanswered_keepalive_after_an_http_error_ends_the_session_and_a_new_one_starts_afresh()
    {
        let mut lifecycle = live_at(0);
        keepalive_answered(&mut lifecycle, FIRST, Err(bad_gateway()));
        let ended = keepalive_answered(
            &mut lifecycle,
            2 * FIRST,
            Err(KeepaliveFailure::Unanswered(fault("no answer"))),
        );
        assert_eq!(ended[1], Effect::CloseSession);
        // The next session's first HTTP error is again only noted.
        assert_eq!(lifecycle.handle(Input::Connect, 20_000), [Effect::StartAttempt]);
        assert_eq!(lifecycle.handle(Input::Opened, 20_000), [Effect::AdoptSession]);
        assert_eq!(
            keepalive_answered(&mut lifecycle, 20_000 + FIRST, Err(bad_gateway())).len(),
            1
        );
        assert!(lifecycle.live());
    }

    #[test]
    fn without_a_recorded_end_the_keepalive_fault_is_the_disconnect_reason() {
        let mut lifecycle = live_at(0);
        lifecycle.handle(Input::Tick, FIRST);
        let effects = lifecycle.handle(
            Input::KeepaliveDone {
                result: Err(KeepaliveFailure::Unanswered(fault("no answer"))),
                recorded_end: None,
            },
            FIRST,
        );
        assert_eq!(
            effects.last(),
            Some(&Effect::Feed(EventKind::Disconnected(server_fault(
                "no answer"
            ))))
        );
    }

    #[test]
    fn a_session_end_is_reported_once_and_only_for_a_live_session() {
        let mut lifecycle = live_at(0);
        assert_eq!(
            lifecycle.handle(Input::Ended(fault("process exited")), 10),
            [
                Effect::CloseSession,
                Effect::Feed(EventKind::Disconnected(server_fault("process exited"))),
            ]
        );
        assert_eq!(lifecycle.handle(Input::Ended(fault("again")), 11), []);
    }

    #[test]
    fn connect_replaces_the_live_session_and_disconnect_drops_an_attempt() {
        let mut lifecycle = live_at(0);
        assert_eq!(
            lifecycle.handle(Input::Connect, 10),
            [Effect::CloseSession, Effect::StartAttempt]
        );
        assert_eq!(
            lifecycle.handle(Input::Disconnect, 11),
            [Effect::DropAttempt]
        );
        assert_eq!(lifecycle.handle(Input::Disconnect, 12), []);
    }

    #[test]
    fn a_failed_attempt_tells_the_policy_and_leaves_nothing_live() {
        let mut lifecycle = lifecycle();
        lifecycle.handle(Input::Connect, 0);
        assert_eq!(
            lifecycle.handle(Input::AttemptFailed(fault("refused")), 5),
            [Effect::Feed(EventKind::ConnectFailed(server_fault(
                "refused"
            )))]
        );
        assert!(!lifecycle.live());
        assert_eq!(
            lifecycle.handle(
                Input::ListsChanged {
                    tools: true,
                    catalog: true
                },
                6
            ),
            [],
            "no session, nothing to refresh"
        );
    }

    #[test]
    fn the_policys_timer_fires_once_at_its_time_and_a_later_request_replaces_it() {
        let mut lifecycle = lifecycle();
        lifecycle.handle(Input::WakeAt { at: 100, token: 1 }, 0);
        lifecycle.handle(Input::WakeAt { at: 250, token: 2 }, 10);
        assert_eq!(lifecycle.deadline(), Some(250));
        assert_eq!(lifecycle.handle(Input::Tick, 100), []);
        let timer = Effect::Feed(EventKind::Timer(TimerFired {
            server: "files".into(),
            token: 2,
        }));
        assert_eq!(lifecycle.handle(Input::Tick, 251), [timer]);
        assert_eq!(lifecycle.handle(Input::Tick, 300), []);
        assert_eq!(lifecycle.deadline(), None);
    }

    #[test]
    fn many_list_notices_make_one_refresh_and_one_more() {
        let mut lifecycle = live_at(0);
        let changed = Input::ListsChanged {
            tools: true,
            catalog: false,
        };
        assert_eq!(lifecycle.handle(changed.clone(), 1), [Effect::RefreshTools]);
        for at in 2..10 {
            assert_eq!(lifecycle.handle(changed.clone(), at), []);
        }
        let listed = lifecycle.handle(Input::ToolsListed(Ok(vec![])), 20);
        assert_eq!(
            listed,
            [
                Effect::Feed(EventKind::ToolsChanged(ServerTools {
                    server: "files".into(),
                    tools: vec![],
                })),
                Effect::RefreshTools
            ]
        );
        let last = lifecycle.handle(Input::ToolsListed(Err(fault("timed out"))), 30);
        assert_eq!(last, [Effect::NoteFault(fault("timed out"))]);
        assert_eq!(lifecycle.handle(changed, 40), [Effect::RefreshTools]);
    }

    #[test]
    fn a_list_the_session_failed_to_give_brings_its_keepalive_forward() {
        let tools_changed = Input::ListsChanged {
            tools: true,
            catalog: false,
        };
        let catalog_changed = Input::ListsChanged {
            tools: false,
            catalog: true,
        };
        // Read: the keepalive keeps its time.
        let mut lifecycle = live_at(0);
        lifecycle.handle(tools_changed.clone(), 1);
        lifecycle.handle(Input::ToolsListed(Ok(vec![])), 2);
        lifecycle.handle(catalog_changed.clone(), 3);
        lifecycle.handle(Input::CatalogListed { failed: false }, 4);
        assert_eq!(lifecycle.deadline(), Some(FIRST));
        // Not read: the session is asked now; refused twice, it ends.
        for failed_read in [
            Input::ToolsListed(Err(fault("tools/list failed: HTTP 400"))),
            Input::CatalogListed { failed: true },
        ] {
            let mut lifecycle = live_at(0);
            let changed = match failed_read {
                Input::ToolsListed(_) => tools_changed.clone(),
                _ => catalog_changed.clone(),
            };
            lifecycle.handle(changed, 1);
            lifecycle.handle(failed_read, 5);
            assert_eq!(lifecycle.deadline(), Some(5));
            assert_eq!(lifecycle.handle(Input::Tick, 5), [Effect::StartKeepalive]);
            let refused = || KeepaliveFailure::Refused(fault("HTTP 400"));
            let asked = lifecycle.handle(
                Input::KeepaliveDone {
                    result: Err(refused()),
                    recorded_end: None,
                },
                6,
            );
            assert_eq!(asked.len(), 1, "{asked:?}");
            assert_eq!(lifecycle.handle(Input::Tick, 6), [Effect::StartKeepalive]);
            let ended = lifecycle.handle(
                Input::KeepaliveDone {
                    result: Err(refused()),
                    recorded_end: None,
                },
                7,
            );
            assert_eq!(ended[1], Effect::CloseSession);
            assert!(!lifecycle.live());
        }
    }

    #[test]
    fn a_list_failed_while_an_http_error_is_asked_again_keeps_the_second_chance() {
        // A proxy answers 502 while its server restarts: the keepalive fails, and so do the
        // list reads the server's last announcement started. The session keeps its wait.
        let mut lifecycle = live_at(0);
        keepalive_answered(&mut lifecycle, FIRST, Err(bad_gateway()));
        let retry_at = 2 * FIRST;
        assert_eq!(lifecycle.deadline(), Some(retry_at));
        let both = Input::ListsChanged {
            tools: true,
            catalog: true,
        };
        lifecycle.handle(both, FIRST + 1);
        lifecycle.handle(Input::ToolsListed(Err(fault("HTTP 502"))), FIRST + 2);
        lifecycle.handle(Input::CatalogListed { failed: true }, FIRST + 3);
        assert_eq!(lifecycle.deadline(), Some(retry_at));
        assert_eq!(lifecycle.handle(Input::Tick, FIRST + 3), []);
        // Back by then: the session stays.
        assert_eq!(
            keepalive_answered(&mut lifecycle, retry_at, Ok(())),
            [Effect::Feed(EventKind::KeepaliveOk("files".into()))]
        );
        assert!(lifecycle.live());
    }

    #[test]
    fn catalog_refreshes_follow_the_same_rule_and_never_reach_the_policy() {
        let mut lifecycle = live_at(0);
        let changed = Input::ListsChanged {
            tools: false,
            catalog: true,
        };
        assert_eq!(
            lifecycle.handle(changed.clone(), 1),
            [Effect::RefreshCatalog]
        );
        assert_eq!(lifecycle.handle(changed, 2), []);
        assert_eq!(
            lifecycle.handle(Input::CatalogListed { failed: false }, 3),
            [Effect::RefreshCatalog]
        );
        assert_eq!(
            lifecycle.handle(Input::CatalogListed { failed: false }, 4),
            []
        );
    }

    #[test]
    fn a_session_the_policy_could_not_take_is_closed_and_reported_as_a_failed_connect() {
        let mut lifecycle = live_at(0);
        let effects = lifecycle.handle(Input::PolicyRefusedSession("out of fuel".into()), 1);
        assert_eq!(effects[0], Effect::CloseSession);
        assert!(matches!(
            &effects[1],
            Effect::Feed(EventKind::ConnectFailed(f))
                if f.fault.to_string().contains("the policy could not take the session (out of fuel)")
        ));
        assert!(!lifecycle.live());
    }
}
