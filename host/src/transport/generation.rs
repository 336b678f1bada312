//! Which MCP protocol generation an upstream speaks: 2026-07-28 (`server/discover`, per-request
//! metadata, no `ping`, change notifications on `subscriptions/listen`) or 2025-11-25 and older
//! (`initialize`, sessions). Decides the lifecycle a session opens with, and fixes the one
//! answer rmcp's probe misreads.

use rmcp::ClientLifecycleMode;
use rmcp::model::{ErrorCode, ProtocolVersion, ServerJsonRpcMessage};

use crate::config::ProtocolChoice;

/// A server's protocol generation, once a session showed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generation {
    /// 2026-07-28 and later: no `initialize` handshake.
    Modern,
    /// 2025-11-25 and older: `initialize`, `ping`, unscoped notifications.
    Legacy,
}

impl Generation {
    /// The generation of a negotiated version.
    pub fn of(version: &ProtocolVersion) -> Self {
        if version.has_initialize() {
            Generation::Legacy
        } else {
            Generation::Modern
        }
    }
}

/// How to open a session: what the operator chose, else what worked last time, else a probe
/// (`server/discover`, falling back to `initialize`).
pub fn lifecycle(choice: ProtocolChoice, known: Option<Generation>) -> ClientLifecycleMode {
    match (choice, known) {
        (ProtocolChoice::Legacy, _) | (ProtocolChoice::Auto, Some(Generation::Legacy)) => {
            ClientLifecycleMode::Initialize
        }
        (ProtocolChoice::Modern, _) | (ProtocolChoice::Auto, Some(Generation::Modern)) => {
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            }
        }
        (ProtocolChoice::Auto, None) => ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: Some(ProtocolVersion::V_2025_11_25),
        },
    }
}

/// Why a handshake failed, with the configured generation when the operator pinned one (the
/// likely reason a server refuses).
pub fn describe_refusal(error: &impl std::fmt::Display, choice: ProtocolChoice) -> String {
    match choice {
        ProtocolChoice::Auto => error.to_string(),
        ProtocolChoice::Modern => {
            format!("{error} (protocol \"2026-07-28\" is configured: does the server speak it?)")
        }
        ProtocolChoice::Legacy => {
            format!(
                "{error} (protocol \"2025-11-25\" is configured: does the server still offer initialize?)"
            )
        }
    }
}

/// A server that only speaks versions with `initialize` may answer the discover probe with
/// "unsupported protocol version" (-32022) listing only those versions: by the spec such a
/// server is legacy, but rmcp's probe gives up instead of falling back. Such an answer is
/// turned into "method not found", which the probe reads as legacy. True if it changed.
pub fn legacy_only_rejection(message: &mut ServerJsonRpcMessage) -> bool {
    let ServerJsonRpcMessage::Error(error) = message else {
        return false;
    };
    if error.error.code != ErrorCode::UNSUPPORTED_PROTOCOL_VERSION {
        return false;
    }
    let supported: Vec<ProtocolVersion> = error
        .error
        .data
        .as_ref()
        .and_then(|data| data.get("supported"))
        .cloned()
        .and_then(|value| serde_json::from_value(value).ok())
        .unwrap_or_default();
    if supported.is_empty() || supported.iter().any(|v| !v.has_initialize()) {
        return false;
    }
    error.error.code = ErrorCode::METHOD_NOT_FOUND;
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{ErrorData, RequestId};
    use serde_json::json;

    fn rejection(supported: serde_json::Value) -> ServerJsonRpcMessage {
        ServerJsonRpcMessage::error(
            ErrorData::new(
                ErrorCode::UNSUPPORTED_PROTOCOL_VERSION,
                "unsupported protocol version",
                Some(json!({"supported": supported})),
            ),
            Some(RequestId::Number(1)),
        )
    }

    fn code(message: &ServerJsonRpcMessage) -> ErrorCode {
        match message {
            ServerJsonRpcMessage::Error(error) => error.error.code,
            _ => unreachable!(),
        }
    }

    #[test]
    fn a_server_of_initialize_versions_only_is_read_as_legacy() {
        let mut only_legacy = rejection(json!(["2025-06-18", "2025-11-25"]));
        assert!(legacy_only_rejection(&mut only_legacy));
        assert_eq!(code(&only_legacy), ErrorCode::METHOD_NOT_FOUND);
        // A server that also speaks a modern version negotiates: left alone.
        let mut negotiates = rejection(json!(["2025-11-25", "2026-07-28"]));
        assert!(!legacy_only_rejection(&mut negotiates));
        assert_eq!(code(&negotiates), ErrorCode::UNSUPPORTED_PROTOCOL_VERSION);
        let mut says_nothing = rejection(json!([]));
        assert!(!legacy_only_rejection(&mut says_nothing));
    }

    #[test]
    fn the_operator_choice_wins_then_what_worked_then_a_probe() {
        let discover = ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        };
        assert_eq!(
            lifecycle(ProtocolChoice::Legacy, Some(Generation::Modern)),
            ClientLifecycleMode::Initialize
        );
        assert_eq!(lifecycle(ProtocolChoice::Modern, None), discover);
        assert_eq!(
            lifecycle(ProtocolChoice::Auto, Some(Generation::Modern)),
            discover
        );
        assert_eq!(
            lifecycle(ProtocolChoice::Auto, Some(Generation::Legacy)),
            ClientLifecycleMode::Initialize
        );
        assert!(matches!(
            lifecycle(ProtocolChoice::Auto, None),
            ClientLifecycleMode::Auto { .. }
        ));
        assert_eq!(
            Generation::of(&ProtocolVersion::V_2025_11_25),
            Generation::Legacy
        );
        assert_eq!(
            Generation::of(&ProtocolVersion::V_2026_07_28),
            Generation::Modern
        );
    }
}
