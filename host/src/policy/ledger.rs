//! What is true of the host's servers, as the events and actions passing through the runtime
//! tell it: each server's configuration, its live session (with the latest tool list) and
//! whether an attempt is in flight. It outlives policy instances, so it is what a policy of
//! another implementation is told on a swap ([`Ledger::handover`], [`Ledger::lessons`]), and
//! where a 0.2 policy's publications get their descriptions and schemas ([`Ledger::tool`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::types::{
    Action, BreakerState, CallOutcome, Event, EventKind, Handover, LiveSession, Millis, PolicyInfo,
    ServerConfig, ServerHandover, ServerState, ServerStatus, SessionInfo, Tool,
};

#[derive(Debug, Clone)]
struct Entry {
    config: ServerConfig,
    session: Option<Live>,
    /// A `connect` went out and its outcome has not come back.
    connecting: bool,
}

/// A live session. The tool list is shared, so that copies of the ledger (one is kept with
/// each checkpoint) cost no copy of the tools.
#[derive(Debug, Clone)]
struct Live {
    server_info: String,
    tools: Tools,
    proven: bool,
}

/// A session's tool list, with an index by name: a publication looks up every tool it
/// publishes, and a linear search made that quadratic (58 s for one list of 100 000 tools).
#[derive(Debug, Clone)]
struct Tools {
    list: Arc<Vec<Tool>>,
    /// The position of the first tool of each name.
    by_name: Arc<HashMap<String, usize>>,
}

impl Tools {
    fn new(list: Vec<Tool>) -> Self {
        let mut by_name = HashMap::with_capacity(list.len());
        for (at, tool) in list.iter().enumerate() {
            by_name.entry(tool.name.clone()).or_insert(at);
        }
        Self {
            list: Arc::new(list),
            by_name: Arc::new(by_name),
        }
    }

    fn get(&self, name: &str) -> Option<&Tool> {
        self.by_name.get(name).map(|&at| &self.list[at])
    }
}

impl Live {
    fn handed_over(&self) -> LiveSession {
        LiveSession {
            server_info: self.server_info.clone(),
            tools: self.tools.list.as_ref().clone(),
            proven: self.proven,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Ledger {
    servers: BTreeMap<String, Entry>,
}

impl Ledger {
    pub fn is_configured(&self, server: &str) -> bool {
        self.servers.contains_key(server)
    }

    /// `original` in `server`'s latest tool list.
    pub fn tool(&self, server: &str, original: &str) -> Option<&Tool> {
        self.servers
            .get(server)?
            .session
            .as_ref()?
            .tools
            .get(original)
    }

    /// Takes in what an event says happened (before the policy hears it).
    pub fn note_event(&mut self, event: &Event) {
        fn entry<'a>(
            servers: &'a mut BTreeMap<String, Entry>,
            name: &str,
        ) -> Option<&'a mut Entry> {
            servers.get_mut(name)
        }
        match &event.kind {
            EventKind::ServerConfigured(config) => {
                self.servers
                    .entry(config.name.clone())
                    .and_modify(|entry| entry.config = config.clone())
                    .or_insert_with(|| Entry {
                        config: config.clone(),
                        session: None,
                        connecting: false,
                    });
            }
            EventKind::ServerRemoved(name) => {
                self.servers.remove(name);
            }
            EventKind::Connected(SessionInfo {
                server,
                server_info,
                tools,
            }) => {
                if let Some(entry) = entry(&mut self.servers, server) {
                    entry.connecting = false;
                    entry.session = Some(Live {
                        server_info: server_info.clone(),
                        tools: Tools::new(tools.clone()),
                        proven: false,
                    });
                }
            }
            EventKind::ConnectFailed(f) => {
                if let Some(entry) = entry(&mut self.servers, &f.server) {
                    entry.connecting = false;
                    entry.session = None;
                }
            }
            // The end of a session says nothing of an attempt already asked for.
            EventKind::Disconnected(f) => {
                if let Some(entry) = entry(&mut self.servers, &f.server) {
                    entry.session = None;
                }
            }
            EventKind::ToolsChanged(change) => {
                if let Some(session) =
                    entry(&mut self.servers, &change.server).and_then(|e| e.session.as_mut())
                {
                    session.tools = Tools::new(change.tools.clone());
                }
            }
            EventKind::KeepaliveOk(server) => {
                if let Some(session) =
                    entry(&mut self.servers, server).and_then(|e| e.session.as_mut())
                {
                    session.proven = true;
                }
            }
            EventKind::CallFinished(report)
                if matches!(report.outcome, CallOutcome::Ok | CallOutcome::ToolError(_)) =>
            {
                // An answer proves the session as a keepalive does.
                if let Some(session) =
                    entry(&mut self.servers, &report.server).and_then(|e| e.session.as_mut())
                {
                    session.proven = true;
                }
            }
            _ => {}
        }
    }

    /// Takes in what a handover says the host has: a host that starts from one (conformance's
    /// take-over) knows those servers and sessions.
    pub fn note_handover(&mut self, handover: &Handover) {
        self.servers = handover
            .servers
            .iter()
            .map(|server| {
                let session = server.session.as_ref().map(|live| Live {
                    server_info: live.server_info.clone(),
                    tools: Tools::new(live.tools.clone()),
                    proven: live.proven,
                });
                let entry = Entry {
                    config: server.config.clone(),
                    session,
                    connecting: server.connecting,
                };
                (server.config.name.clone(), entry)
            })
            .collect();
    }

    /// Takes in what the host is about to do.
    pub fn note_actions(&mut self, actions: &[Action]) {
        for action in actions {
            match action {
                Action::Connect(server) => {
                    if let Some(entry) = self.servers.get_mut(server) {
                        // The host tears down any session before the attempt.
                        entry.session = None;
                        entry.connecting = true;
                    }
                }
                Action::Disconnect(server) => {
                    if let Some(entry) = self.servers.get_mut(server) {
                        entry.session = None;
                        entry.connecting = false;
                    }
                }
                _ => {}
            }
        }
    }

    /// Whether a `connect` of `server` went out and its outcome has not come back.
    pub fn is_connecting(&self, server: &str) -> bool {
        self.servers
            .get(server)
            .is_some_and(|entry| entry.connecting)
    }

    /// Whether the host has a session for `server` or an attempt in flight, which a policy
    /// taking over must not replace.
    pub fn is_live(&self, server: &str) -> bool {
        self.servers
            .get(server)
            .is_some_and(|entry| entry.session.is_some() || entry.connecting)
    }

    /// The truth for a policy of another implementation: the host's own knowledge, and the rest
    /// as the outgoing policy reported it in `status`.
    pub fn handover(&self, now: Millis, status: &[ServerStatus], previous: PolicyInfo) -> Handover {
        let servers = self
            .servers
            .values()
            .map(|entry| {
                let reported = status.iter().find(|s| s.server == entry.config.name);
                let mut session = entry.session.as_ref().map(Live::handed_over);
                if let Some(session) = &mut session {
                    session.proven |= reported.is_some_and(|s| s.state == ServerState::Healthy);
                }
                ServerHandover {
                    config: entry.config.clone(),
                    session,
                    connecting: entry.connecting,
                    state: reported.map_or(ServerState::Connecting, |s| s.state),
                    breaker: reported.map_or(BreakerState::Closed, |s| s.breaker),
                    breaker_until: reported.and_then(|s| s.breaker_until),
                    failures: reported.map_or(0, |s| s.failures),
                    breaker_failures: reported.map_or(0, |s| s.breaker_failures),
                    tool_errors: reported.map_or(0, |s| s.tool_errors),
                    last_fault: reported.and_then(|s| s.last_fault.clone()),
                    since: reported.map_or(now, |s| s.since),
                    next_attempt_at: reported.and_then(|s| s.next_attempt_at),
                }
            })
            .collect();
        Handover {
            now,
            servers,
            previous,
        }
    }

    /// The truth as events, for a policy that knows no handover (contract 0.1): each server
    /// configured, then its live session connected (and proven, if it was).
    pub fn lessons(&self, now: Millis, status: &[ServerStatus]) -> Vec<Event> {
        let mut events = Vec::new();
        for entry in self.servers.values() {
            let name = &entry.config.name;
            let event = |kind| Event { now, kind };
            events.push(event(EventKind::ServerConfigured(entry.config.clone())));
            if let Some(session) = &entry.session {
                events.push(event(EventKind::Connected(SessionInfo {
                    server: name.clone(),
                    server_info: session.server_info.clone(),
                    tools: session.tools.list.as_ref().clone(),
                })));
                let healthy = status
                    .iter()
                    .any(|s| &s.server == name && s.state == ServerState::Healthy);
                if session.proven || healthy {
                    events.push(event(EventKind::KeepaliveOk(name.clone())));
                }
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::types::{ServerFault, TransportKind};

    fn event(kind: EventKind) -> Event {
        Event { now: 1, kind }
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

    fn ended(name: &str) -> ServerFault {
        ServerFault {
            server: name.into(),
            fault: crate::policy::Fault::SessionExpired,
        }
    }

    #[test]
    fn tools_are_found_by_name_in_the_latest_list_first_of_a_name_winning() {
        let tool = |name: &str, description: &str| Tool {
            name: name.into(),
            description: Some(description.into()),
            input_schema: "{}".into(),
            extra: String::new(),
            read_only: false,
        };
        let mut ledger = Ledger::default();
        ledger.note_event(&event(configured("a")));
        ledger.note_event(&event(EventKind::Connected(SessionInfo {
            server: "a".into(),
            server_info: "x".into(),
            tools: vec![
                tool("one", "first"),
                tool("two", "2"),
                tool("one", "second"),
            ],
        })));
        let found =
            |ledger: &Ledger, name| ledger.tool("a", name).and_then(|t| t.description.clone());
        assert_eq!(found(&ledger, "one").as_deref(), Some("first"));
        assert_eq!(found(&ledger, "three"), None);
        ledger.note_event(&event(EventKind::ToolsChanged(
            crate::policy::types::ServerTools {
                server: "a".into(),
                tools: vec![tool("three", "3")],
            },
        )));
        assert_eq!(found(&ledger, "three").as_deref(), Some("3"));
        assert_eq!(
            found(&ledger, "one"),
            None,
            "the index follows the latest list"
        );
    }

    #[test]
    fn an_old_session_ending_does_not_hide_an_attempt_in_flight() {
        let mut ledger = Ledger::default();
        ledger.note_event(&event(configured("a")));
        ledger.note_event(&event(EventKind::Connected(SessionInfo {
            server: "a".into(),
            server_info: "a 1".into(),
            tools: vec![],
        })));
        // A reconnect is asked for; the old session's end is reported after it.
        ledger.note_actions(&[Action::Connect("a".into())]);
        ledger.note_event(&event(EventKind::Disconnected(ended("a"))));
        assert!(ledger.is_live("a"), "the attempt is still in flight");
        ledger.note_event(&event(EventKind::ConnectFailed(ended("a"))));
        assert!(!ledger.is_live("a"));
    }

    #[test]
    fn the_handover_says_what_the_host_knows_and_the_policy_reported() {
        let mut ledger = Ledger::default();
        ledger.note_event(&event(configured("a")));
        ledger.note_event(&event(configured("b")));
        ledger.note_event(&event(EventKind::Connected(SessionInfo {
            server: "a".into(),
            server_info: "a 1".into(),
            tools: vec![],
        })));
        ledger.note_event(&event(EventKind::KeepaliveOk("a".into())));
        let status = [ServerStatus {
            server: "b".into(),
            state: ServerState::Parked,
            breaker: BreakerState::Open,
            failures: 4,
            breaker_failures: 3,
            tool_errors: 1,
            last_fault: Some("gone".into()),
            since: 7,
            published_tools: 0,
            next_attempt_at: Some(30_000),
            breaker_until: Some(60_000),
        }];
        let info = PolicyInfo {
            name: "p".into(),
            version: "1".into(),
        };
        let handover = ledger.handover(9, &status, info);
        let a = &handover.servers[0];
        assert!(a.session.as_ref().is_some_and(|s| s.proven));
        let b = &handover.servers[1];
        assert!(b.session.is_none() && !b.connecting);
        assert_eq!(
            (
                b.state,
                b.breaker,
                b.failures,
                b.next_attempt_at,
                b.breaker_until
            ),
            (
                ServerState::Parked,
                BreakerState::Open,
                4,
                Some(30_000),
                Some(60_000)
            )
        );
    }
}
