//! Host-level integration tests for Tether live in `tests/tests/`; fixture servers and the CLI
//! under test in `src/bin/`; misbehaving policy components in `policies/`.
//!
//! This library holds what the tests share.

pub mod chaos;

use std::path::PathBuf;

use tether::policy::{
    Action, EventKind, Fault, PolicySource, ServerConfig, ServerFault, SessionInfo, Tool,
    TransportKind,
};

/// Test policy components, built for wasm32-wasip2 by this package's build script.
pub mod components {
    pub const HOSTILE: &str = env!("TETHER_TEST_POLICY_HOSTILE");
    pub const WRONG: &str = env!("TETHER_TEST_POLICY_WRONG");
    pub const NEXT_MINOR: &str = env!("TETHER_TEST_POLICY_NEXT_MINOR");
    /// Built for contract 0.2.0, before `set-naming` and `name-prompts`.
    pub const PREVIOUS_MINOR: &str = env!("TETHER_TEST_POLICY_PREVIOUS_MINOR");
    pub const OTHER: &str = env!("TETHER_TEST_POLICY_OTHER");
    pub const INCOMPATIBLE: &str = env!("TETHER_TEST_POLICY_INCOMPATIBLE");
    /// Other designs than the default's, which keep the contract (guest/test-policies/*/src/lib.rs):
    /// a fixed interval forever, no breaker, a withdrawal on every failure;
    pub const FIXED_INTERVAL: &str = env!("TETHER_TEST_POLICY_FIXED_INTERVAL");
    /// gives up after a few attempts and never probes;
    pub const GIVES_UP: &str = env!("TETHER_TEST_POLICY_GIVES_UP");
    /// withdraws and republishes every server's tools on every event.
    pub const REPUBLISHES: &str = env!("TETHER_TEST_POLICY_REPUBLISHES");
    /// The default with one contract rule broken, chosen by its `"mutant"` setting.
    pub const MUTANT: &str = env!("TETHER_TEST_POLICY_MUTANT");
}

pub fn component(path: &str) -> PolicySource {
    PolicySource::File(PathBuf::from(path))
}

pub fn tool(name: &str) -> Tool {
    Tool {
        name: name.into(),
        description: None,
        input_schema: r#"{"type":"object"}"#.into(),
        extra: String::new(),
        read_only: false,
    }
}

pub fn configured(server: &str) -> EventKind {
    EventKind::ServerConfigured(ServerConfig {
        name: server.into(),
        transport: TransportKind::Stdio,
        include: vec![],
        exclude: vec![],
        settings: String::new(),
        prefix: None,
    })
}

pub fn connected(server: &str, tools: &[&str]) -> EventKind {
    EventKind::Connected(SessionInfo {
        server: server.into(),
        server_info: "test".into(),
        tools: tools.iter().map(|t| tool(t)).collect(),
    })
}

pub fn disconnected(server: &str) -> EventKind {
    EventKind::Disconnected(ServerFault {
        server: server.into(),
        fault: Fault::ProcessExited(Some(1)),
    })
}

pub fn connect_failed(server: &str) -> EventKind {
    EventKind::ConnectFailed(ServerFault {
        server: server.into(),
        fault: Fault::HandshakeTimedOut,
    })
}

/// A live process (a zombie has a /proc entry too; its state letter is Z).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// The text of a tool result.
pub fn text(result: &rmcp::model::CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn has_connect(actions: &[Action], server: &str) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, Action::Connect(s) if s == server))
}
