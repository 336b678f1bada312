//! Runs a scenario's steps against one policy component, here, and writes the transcript of
//! every call into the policy (`docs/CONFORMANCE.md`), which every host must write alike.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;

use super::script::{AdmissionCase, Predicate, Step};
use super::wire;
use crate::policy::instance::{Limits, PolicyInstance};
use crate::policy::ledger::Ledger;
use crate::policy::outputs::{check_actions, check_take_over, valid_tool_name};
use crate::policy::types::{
    Action, Admission, CallOutcome, CallReport, CallRequest, Event, EventKind, Handover,
    NamedPrompt, Naming, PublishedTool, ServerStatus, TimerFired,
};
use crate::policy::{LoadedPolicy, PolicyFault};

/// One line of a transcript.
#[derive(Serialize)]
#[serde(tag = "do", rename_all = "kebab-case")]
enum Line<'a> {
    Init {
        settings: &'a str,
    },
    Handle {
        event: wire::Event<'a>,
        actions: Vec<wire::Action<'a>>,
    },
    Admit {
        request: wire::CallRequest<'a>,
        admission: wire::Admission<'a>,
    },
    Status {
        now: u64,
        status: Vec<wire::ServerStatus<'a>>,
    },
    SnapshotRestore,
    TakeOver {
        handover: wire::Handover<'a>,
        actions: Vec<wire::Action<'a>>,
    },
    SetNaming {
        naming: &'a Naming,
    },
    NamePrompts {
        server: &'a str,
        originals: &'a [String],
        named: &'a [NamedPrompt],
    },
}

/// How a list of steps ended.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    /// All ran.
    Ran,
    /// A `stop-if` held: the enclosing `repeat` ends.
    Stop,
    /// The scenario cannot go further with this component and ends here as passed (a 0.1
    /// policy is handed no handover).
    End,
}

/// What the host keeps between calls, and a `twice` block restarts from.
#[derive(Clone)]
struct HostState {
    now: u64,
    wakes: BTreeMap<String, (u64, u64)>,
    next_call: u64,
    calls: BTreeMap<String, u64>,
    last_call: Option<u64>,
    /// What the host shows of each server: its publication in force, by advertised name.
    published: BTreeMap<String, Vec<PublishedTool>>,
}

/// Runs steps, keeping the state a host keeps (`docs/CONFORMANCE.md`).
pub struct Interpreter {
    policy: Arc<LoadedPolicy>,
    settings: String,
    instance: PolicyInstance,
    /// What the host knows of the servers: the descriptions of a 0.2 policy's publications.
    ledger: Ledger,
    host: HostState,
    actions: Vec<Action>,
    /// Servers a tool action of the latest actions was about that changed nothing.
    redundant: BTreeSet<String>,
    admission: Option<Admission>,
    status: Vec<ServerStatus>,
    prompt_names: Vec<NamedPrompt>,
    transcript: String,
    /// Calls into the policy so far, and the latest, for failure messages.
    step: usize,
    last: String,
}

impl Interpreter {
    /// A fresh instance of `policy`, given `init(settings)`.
    pub fn start(policy: &Arc<LoadedPolicy>, settings: &str) -> Result<Self, String> {
        let mut interpreter = Self {
            policy: policy.clone(),
            settings: settings.to_string(),
            instance: fresh(policy, settings)?,
            ledger: Ledger::default(),
            host: HostState {
                now: 1_000,
                wakes: BTreeMap::new(),
                next_call: 1,
                calls: BTreeMap::new(),
                last_call: None,
                published: BTreeMap::new(),
            },
            actions: Vec::new(),
            redundant: BTreeSet::new(),
            admission: None,
            status: Vec::new(),
            prompt_names: Vec::new(),
            transcript: String::new(),
            step: 0,
            last: "start".into(),
        };
        record(&mut interpreter.transcript, &Line::Init { settings });
        Ok(interpreter)
    }

    /// Runs a scenario's steps; a failure says at which call into the policy it happened.
    pub fn run(&mut self, steps: &[Step]) -> Result<(), String> {
        self.steps(steps)
            .map(|_| ())
            .map_err(|why| format!("at step {} ({}): {why}", self.step, self.last))
    }

    /// Whether the component implements contract version `since` (what a scenario's `since`
    /// names): 0.2.1 adds `set-naming` and `name-prompts`.
    pub fn implements(&self, since: &str) -> bool {
        match since {
            "0.2.1" => self.instance.takes_naming(),
            _ => false,
        }
    }

    /// The transcript so far: one JSON line per call into the policy.
    pub fn transcript(&self) -> &str {
        &self.transcript
    }

    fn steps(&mut self, steps: &[Step]) -> Result<Flow, String> {
        for step in steps {
            match self.step_one(step)? {
                Flow::Ran => {}
                other => return Ok(other),
            }
        }
        Ok(Flow::Ran)
    }

    fn step_one(&mut self, step: &Step) -> Result<Flow, String> {
        match step {
            Step::Event { kind } => self.handle(kind.clone())?,
            Step::FireTimer { server, optional } => match self.host.wakes.remove(server) {
                Some((at, token)) => {
                    self.host.now = self.host.now.max(at);
                    self.handle(EventKind::Timer(TimerFired {
                        server: server.clone(),
                        token,
                    }))?;
                }
                None if *optional => {}
                None => return Err(format!("expected a timer armed for {server}, none is")),
            },
            Step::Advance { ms } => self.host.now = self.host.now.saturating_add(*ms),
            Step::Admit { server, tool, name } => {
                let call_id = self.admit(server, tool)?;
                if let Some(name) = name {
                    self.host.calls.insert(name.clone(), call_id);
                }
            }
            Step::Finish {
                server,
                call,
                outcome,
            } => {
                let call_id = match call {
                    Some(name) => self.host.calls.get(name).copied(),
                    None => self.host.last_call,
                }
                .ok_or_else(|| match call {
                    Some(name) => format!("no call named {name} was admitted"),
                    None => "no call was admitted".to_string(),
                })?;
                self.finish(server, call_id, outcome.clone())?;
            }
            Step::Call {
                server,
                tool,
                outcome,
            } => {
                let call_id = self.admit(server, tool)?;
                if matches!(self.admission, Some(Admission::Allow | Admission::Probe)) {
                    self.finish(server, call_id, outcome.clone())?;
                }
            }
            Step::Status => {
                self.status = self.status_now()?;
                let line = Line::Status {
                    now: self.host.now,
                    status: wire::statuses(&self.status),
                };
                record(&mut self.transcript, &line);
            }
            Step::SnapshotRestore { steps } => return self.snapshot_restore(steps),
            Step::TakeOver { handover, namings } => {
                if !self.instance.can_take_over() {
                    return Ok(Flow::End);
                }
                self.take_over(handover, namings.as_deref().unwrap_or_default())?;
            }
            Step::SetNaming { naming } => {
                self.called(format!("set the naming of {}", naming.server));
                self.set_naming(naming)?;
            }
            Step::NamePrompts { server, originals } => {
                self.called(format!("name the prompts of {server}"));
                let named = self
                    .instance
                    .name_prompts(server, originals)
                    .map_err(|e| e.to_string())?
                    .ok_or("the policy has no name-prompts (contract 0.2.0)")?;
                let line = Line::NamePrompts {
                    server,
                    originals,
                    named: &named,
                };
                record(&mut self.transcript, &line);
                self.prompt_names = named;
            }
            Step::Twice { steps } => return self.twice(steps),
            Step::Repeat {
                times,
                steps,
                otherwise,
            } => {
                for _ in 0..*times {
                    match self.steps(steps)? {
                        Flow::Ran => {}
                        Flow::Stop => return Ok(Flow::Ran),
                        Flow::End => return Ok(Flow::End),
                    }
                }
                if let Some(message) = otherwise {
                    return Err(message.clone());
                }
            }
            Step::StopIf { that } => {
                if self.holds(that)? {
                    return Ok(Flow::Stop);
                }
            }
            Step::Expect { that, otherwise } => {
                if !self.holds(that)? {
                    return Err(format!("{otherwise}; {}", self.context(that)));
                }
            }
        }
        Ok(Flow::Ran)
    }

    fn called(&mut self, what: String) {
        self.step += 1;
        self.last = what;
    }

    fn handle(&mut self, kind: EventKind) -> Result<(), String> {
        self.called(describe(&kind));
        let event = Event {
            now: self.host.now,
            kind,
        };
        let actions = self
            .instance
            .decide_event(&mut self.ledger, &event)
            .map_err(|e| e.to_string())?;
        self.apply(actions);
        let line = Line::Handle {
            event: (&event).into(),
            actions: wire::actions(&self.actions),
        };
        record(&mut self.transcript, &line);
        Ok(())
    }

    /// A take-over's answer no correct policy gives, worded as the runtime words it.
    fn invalid(&self, during: &'static str, why: String) -> String {
        self.instance
            .policy()
            .fault(during, PolicyFault::InvalidOutput(why))
            .to_string()
    }

    /// Does what the policy asked: arms its timers, and shows or hides tools as the host does,
    /// absorbing what changes nothing (`host/src/registry.rs`).
    fn apply(&mut self, actions: Vec<Action>) {
        self.redundant.clear();
        for action in &actions {
            match action {
                Action::WakeAt(wake) => {
                    self.host
                        .wakes
                        .insert(wake.server.clone(), (wake.at, wake.token));
                }
                Action::PublishTools(publication) => {
                    let mut tools = publication.tools.clone();
                    tools.sort_by(|a, b| a.advertised.cmp(&b.advertised));
                    let server = &publication.server;
                    if self.host.published.get(server) == Some(&tools) {
                        self.redundant.insert(server.clone());
                    } else {
                        self.host.published.insert(server.clone(), tools);
                    }
                }
                // The guard hides what is shown; when nothing was, the withdrawal is redundant.
                Action::WithdrawTools(server) if self.host.published.remove(server).is_none() => {
                    self.redundant.insert(server.clone());
                }
                _ => {}
            }
        }
        self.actions = actions;
    }

    fn admit(&mut self, server: &str, tool: &str) -> Result<u64, String> {
        self.called(format!("admit a call to {server}/{tool}"));
        let request = CallRequest {
            now: self.host.now,
            call_id: self.host.next_call,
            server: server.into(),
            tool: tool.into(),
        };
        self.host.next_call += 1;
        self.host.last_call = Some(request.call_id);
        let admission = self
            .instance
            .decide_admission(&request)
            .map_err(|e| e.to_string())?;
        let line = Line::Admit {
            request: (&request).into(),
            admission: (&admission).into(),
        };
        record(&mut self.transcript, &line);
        self.admission = Some(admission);
        Ok(request.call_id)
    }

    fn finish(&mut self, server: &str, call_id: u64, outcome: CallOutcome) -> Result<(), String> {
        self.handle(EventKind::CallFinished(CallReport {
            server: server.into(),
            call_id,
            outcome,
            duration_ms: 5,
        }))
    }

    fn status_now(&mut self) -> Result<Vec<ServerStatus>, String> {
        self.instance
            .status(self.host.now)
            .map_err(|e| e.to_string())
    }

    fn snapshot_restore(&mut self, steps: &[Step]) -> Result<Flow, String> {
        self.called("snapshot and restore into a fresh instance".into());
        let before = self.status_now()?;
        let snapshot = self.instance.snapshot().map_err(|e| e.to_string())?;
        // The original answers the steps first; the restored instance answers them again from
        // the host's state as it was at the snapshot.
        let (host, ledger) = (self.host.clone(), self.ledger.clone());
        let first_from = self.transcript.len();
        let flow = self.steps(steps)?;
        let first = self.transcript[first_from..].to_string();
        if !steps.is_empty() {
            self.called("restore the snapshot into a fresh instance".into());
            self.host = host;
            self.ledger = ledger;
        }
        let mut fresh = fresh(&self.policy, &self.settings)?;
        fresh
            .restore(&snapshot)
            .map_err(|e| format!("moving the state into a fresh instance failed: {e}"))?;
        self.instance = fresh;
        let after = self.status_now()?;
        record(&mut self.transcript, &Line::SnapshotRestore);
        // The contract does not order `status`: compare server by server.
        let by_server = |mut all: Vec<ServerStatus>| {
            all.sort_by(|a, b| a.server.cmp(&b.server));
            all
        };
        let (before, after) = (by_server(before), by_server(after));
        if before != after {
            return Err(format!(
                "status changed across snapshot/restore: {} -> {}",
                json(&wire::statuses(&before)),
                json(&wire::statuses(&after))
            ));
        }
        let second_from = self.transcript.len();
        self.steps(steps)?;
        same_runs(
            &first,
            &self.transcript[second_from..],
            "the restored instance answered otherwise than the original",
        )?;
        Ok(flow)
    }

    fn set_naming(&mut self, naming: &Naming) -> Result<(), String> {
        if !self.instance.takes_naming() {
            return Err("the policy has no set-naming (contract 0.2.0)".into());
        }
        self.instance
            .set_naming(naming)
            .map_err(|e| e.to_string())?;
        record(&mut self.transcript, &Line::SetNaming { naming });
        Ok(())
    }

    fn take_over(&mut self, handover: &Handover, namings: &[Naming]) -> Result<(), String> {
        self.called(format!("take over from {}", handover.previous.name));
        self.instance = fresh(&self.policy, &self.settings)?;
        record(
            &mut self.transcript,
            &Line::Init {
                settings: &self.settings,
            },
        );
        if self.instance.takes_naming() {
            for naming in namings {
                self.set_naming(naming)?;
            }
        }
        self.ledger.note_handover(handover);
        // The handover says nothing of what the host shows: the policy's publications are new.
        self.host.published.clear();
        let ledger = &self.ledger;
        let actions = self
            .instance
            .take_over(handover, &|server, original| ledger.tool(server, original))
            .map_err(|e| format!("the handover was refused: {e}"))?;
        check_take_over(&actions, &self.ledger)
            .and_then(|()| check_actions(&actions, &self.ledger))
            .map_err(|why| self.invalid("take-over", why))?;
        self.ledger.note_actions(&actions);
        self.apply(actions);
        let line = Line::TakeOver {
            handover: handover.into(),
            actions: wire::actions(&self.actions),
        };
        record(&mut self.transcript, &line);
        Ok(())
    }

    fn twice(&mut self, steps: &[Step]) -> Result<Flow, String> {
        let (host, ledger) = (self.host.clone(), self.ledger.clone());
        let first_from = self.transcript.len();
        let flow = self.steps(steps)?;
        let first = self.transcript[first_from..].to_string();
        self.host = host;
        self.ledger = ledger;
        self.instance = fresh(&self.policy, &self.settings)?;
        record(
            &mut self.transcript,
            &Line::Init {
                settings: &self.settings,
            },
        );
        let second_from = self.transcript.len();
        self.steps(steps)?;
        same_runs(
            &first,
            &self.transcript[second_from..],
            "the same inputs gave other outputs in a fresh instance",
        )?;
        Ok(flow)
    }

    fn holds(&self, predicate: &Predicate) -> Result<bool, String> {
        let count =
            |wanted: &dyn Fn(&Action) -> bool| self.actions.iter().filter(|a| wanted(a)).count();
        Ok(match predicate {
            Predicate::Connects(server) => {
                count(&|a| matches!(a, Action::Connect(s) if s == server)) > 0
            }
            Predicate::Disconnects(server) => {
                count(&|a| matches!(a, Action::Disconnect(s) if s == server)) > 0
            }
            Predicate::Withdraws { server, times } => {
                count(&|a| matches!(a, Action::WithdrawTools(s) if s == server)) == *times
            }
            Predicate::Publishes(server) => self.publication(server).is_some(),
            Predicate::PublishesOriginals { server, originals } => {
                self.publication(server).is_some_and(|tools| {
                    let published: std::collections::BTreeSet<&str> =
                        tools.iter().map(|t| t.original.as_str()).collect();
                    published.len() == tools.len()
                        && published == originals.iter().map(String::as_str).collect()
                })
            }
            // Here, the output checks have already refused unusable names; a host without those
            // checks (the exported JSON) relies on this predicate.
            Predicate::PublishesUsableNames(server) => {
                self.publication(server).is_some_and(|tools| {
                    let mut seen = std::collections::BTreeSet::new();
                    tools.iter().all(|t| {
                        valid_tool_name(&t.advertised) && seen.insert(t.advertised.as_str())
                    })
                })
            }
            Predicate::PublishesAdvertised { server, names } => {
                self.publication(server).is_some_and(|tools| {
                    let published: std::collections::BTreeSet<(&str, &str)> = tools
                        .iter()
                        .map(|t| (t.original.as_str(), t.advertised.as_str()))
                        .collect();
                    published.len() == tools.len()
                        && published
                            == names
                                .iter()
                                .map(|(o, a)| (o.as_str(), a.as_str()))
                                .collect()
                })
            }
            Predicate::NamesPrompts(names) => {
                let named: std::collections::BTreeSet<(&str, &str)> = self
                    .prompt_names
                    .iter()
                    .map(|n| (n.original.as_str(), n.advertised.as_str()))
                    .collect();
                named.len() == self.prompt_names.len()
                    && named
                        == names
                            .iter()
                            .map(|(o, a)| (o.as_str(), a.as_str()))
                            .collect()
            }
            Predicate::TimerArmed(server) => self.host.wakes.contains_key(server),
            Predicate::TimerNotInThePast(server) => self
                .host
                .wakes
                .get(server)
                .is_some_and(|(at, _)| *at >= self.host.now),
            Predicate::Admission(case) => self.admission.as_ref().is_some_and(|a| {
                *case
                    == match a {
                        Admission::Allow => AdmissionCase::Allow,
                        Admission::Probe => AdmissionCase::Probe,
                        Admission::Reject(_) => AdmissionCase::Reject,
                        Admission::Reconnect(_) => AdmissionCase::Reconnect,
                        Admission::Hold(_) => AdmissionCase::Hold,
                    }
            }),
            Predicate::RefusedNaming(server) => match &self.admission {
                Some(Admission::Reject(message) | Admission::Reconnect(message)) => {
                    message.contains(server.as_str())
                }
                Some(Admission::Hold(hold)) => hold.message.contains(server.as_str()),
                _ => false,
            },
            Predicate::Lists(server) => self.status.iter().any(|s| &s.server == server),
            Predicate::Published(server) => self.host.published.contains_key(server),
            Predicate::Redundant(server) => self.redundant.contains(server),
            Predicate::Attempting(server) => self.ledger.is_connecting(server),
            Predicate::State { server, states } => {
                let status = self
                    .status
                    .iter()
                    .find(|s| &s.server == server)
                    .ok_or_else(|| format!("status() does not list {server}"))?;
                states.contains(&status.state)
            }
            Predicate::Not(inner) => !self.holds(inner)?,
        })
    }

    /// The last publication for `server` in the latest actions.
    fn publication(&self, server: &str) -> Option<&[crate::policy::types::PublishedTool]> {
        self.actions.iter().rev().find_map(|a| match a {
            Action::PublishTools(p) if p.server == server => Some(p.tools.as_slice()),
            _ => None,
        })
    }

    /// What the predicate looked at, for a failure's message.
    fn context(&self, predicate: &Predicate) -> String {
        match predicate {
            Predicate::Not(inner) => self.context(inner),
            Predicate::Admission(_) | Predicate::RefusedNaming(_) => match &self.admission {
                Some(admission) => format!(
                    "the admission was {}",
                    json(&wire::Admission::from(admission))
                ),
                None => "no call was admitted".into(),
            },
            Predicate::Lists(_) | Predicate::State { .. } => {
                format!("the status was {}", json(&wire::statuses(&self.status)))
            }
            Predicate::Published(_) => format!(
                "the host holds publications of {}",
                json(&self.host.published.keys().collect::<Vec<_>>())
            ),
            Predicate::NamesPrompts(_) => {
                format!("the prompt names were {}", json(&self.prompt_names))
            }
            Predicate::TimerArmed(_) | Predicate::TimerNotInThePast(_) => {
                format!("at {} the timers were {:?}", self.host.now, self.host.wakes)
            }
            _ => format!("the actions were {}", json(&wire::actions(&self.actions))),
        }
    }
}

/// Fails with `what` when two runs of a block wrote other transcripts, naming the first line
/// that differs.
fn same_runs(first: &str, second: &str, what: &str) -> Result<(), String> {
    match first.lines().zip(second.lines()).position(|(a, b)| a != b) {
        None if first.lines().count() == second.lines().count() => Ok(()),
        at => {
            let at = at.unwrap_or(first.lines().count().min(second.lines().count()));
            Err(format!(
                "{what} (line {} of the block's transcript): {} vs {}",
                at + 1,
                first.lines().nth(at).unwrap_or("nothing"),
                second.lines().nth(at).unwrap_or("nothing"),
            ))
        }
    }
}

fn fresh(policy: &Arc<LoadedPolicy>, settings: &str) -> Result<PolicyInstance, String> {
    let mut instance =
        PolicyInstance::instantiate(policy, &Limits::default()).map_err(|e| e.to_string())?;
    instance.init(settings).map_err(|e| e.to_string())?;
    Ok(instance)
}

fn record(transcript: &mut String, line: &Line<'_>) {
    transcript.push_str(&serde_json::to_string(line).expect("transcript lines serialize"));
    transcript.push('\n');
}

fn json(value: &impl Serialize) -> String {
    serde_json::to_string(value).expect("encoded values serialize")
}

fn describe(kind: &EventKind) -> String {
    match kind {
        EventKind::ServerConfigured(c) => format!("configure {}", c.name),
        EventKind::ServerRemoved(s) => format!("remove {s}"),
        EventKind::Connected(s) => format!("{} connected", s.server),
        EventKind::ConnectFailed(f) => format!("{} failed to connect ({})", f.server, f.fault),
        EventKind::Disconnected(f) => format!("{} disconnected ({})", f.server, f.fault),
        EventKind::ToolsChanged(t) => format!("{} changed its tools", t.server),
        EventKind::KeepaliveOk(s) => format!("{s} answered a keepalive"),
        EventKind::KeepaliveFailed(f) => format!("{} keepalive failed", f.server),
        EventKind::CallFinished(r) => format!(
            "call {} on {} finished: {}",
            r.call_id,
            r.server,
            json(&wire::CallOutcome::from(&r.outcome))
        ),
        EventKind::Timer(t) => format!("timer for {}", t.server),
        EventKind::ReconnectRequested(r) => {
            format!("reconnect {} requested by {:?}", r.server, r.source)
        }
        EventKind::Shutdown => "shutdown".into(),
    }
}
