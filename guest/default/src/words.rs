//! Words for the model and for operators.
//!
//! Messages for the model are stable (tested verbatim): each names the server, says the call was
//! not sent, and says what to do. They describe faults by category only — never the host's fault
//! text, which may carry URLs, paths or credentials — and say "timed out" only for timeouts.

use crate::breaker::OpenReason;
use crate::model::{Fault, Millis, ReconnectSource};

/// Whole seconds for the model: rounded up, at least 1.
pub fn ceil_secs(ms: Millis) -> u64 {
    ms.div_ceil(1_000).max(1)
}

/// Seconds for operators: whole when exact, else one decimal.
pub fn secs(ms: Millis) -> String {
    if ms.is_multiple_of(1_000) {
        format!("{} s", ms / 1_000)
    } else {
        format!("{:.1} s", ms as f64 / 1_000.0)
    }
}

/// What went wrong, in words safe for the model.
pub fn fault_phrase(fault: &Fault) -> String {
    match fault {
        Fault::SpawnFailed(_) => "its process could not be started".into(),
        Fault::HandshakeFailed(_) => "its MCP handshake failed".into(),
        Fault::HandshakeTimedOut => "its MCP handshake timed out".into(),
        Fault::AuthRequired(code) => format!("it requires authorization (HTTP {code})"),
        Fault::NotMcpEndpoint(_) => "its endpoint is not an MCP server".into(),
        Fault::ProcessExited(Some(code)) => format!("its process exited with code {code}"),
        Fault::ProcessExited(None) => "its process was killed by a signal".into(),
        Fault::TransportClosed(_) => "its connection closed".into(),
        Fault::SessionExpired => "its session expired".into(),
        Fault::KeepaliveFailed(_) => "it stopped answering keepalives".into(),
    }
}

fn wait_words(wait_ms: Option<Millis>) -> String {
    match wait_ms {
        Some(ms) => format!("Wait about {} s and retry.", ceil_secs(ms)),
        None => "Wait a few seconds and retry.".into(),
    }
}

/// No live session: an attempt is in progress or due.
pub fn reconnecting(server: &str, last_fault: Option<&Fault>, wait_ms: Option<Millis>) -> String {
    let what = match last_fault {
        Some(fault) => format!("is reconnecting after {}", fault_phrase(fault)),
        None => "is connecting".into(),
    };
    format!(
        "Server {server:?} {what}; the call was not sent. {}",
        wait_words(wait_ms)
    )
}

/// The breaker is open.
pub fn breaker_open(server: &str, reason: OpenReason, wait_ms: Millis) -> String {
    let why = match reason {
        OpenReason::Failures(1) => "circuit open after a transport failure".to_string(),
        OpenReason::Failures(n) => {
            format!("circuit open after {n} consecutive transport failures")
        }
        OpenReason::ProbeFailed => "circuit open after a test call failed".into(),
        OpenReason::ReconnectFailed => "circuit open after a reconnect attempt failed".into(),
    };
    format!(
        "Server {server:?} is failing ({why}); the call was not sent. {}",
        wait_words(Some(wait_ms))
    )
}

/// The breaker is half-open and its single test call is in flight.
pub fn breaker_probing(server: &str) -> String {
    format!(
        "Server {server:?} is failing (circuit half-open: a test call is in progress); the call was not sent. {}",
        wait_words(None)
    )
}

/// The server is parked; `why` comes from [`crate::server::ParkReason::model_words`], `advice`
/// from [`crate::server::ParkReason::model_advice`].
pub fn parked(server: &str, why: &str, advice: &str) -> String {
    format!("Server {server:?} is unavailable ({why}); the call was not sent. {advice}")
}

/// What to do about a parked server that another attempt may revive.
pub const RECONNECT_ADVICE: &str = "Ask an operator to reconnect it.";

/// What to do about a server parked until someone logs in. The command is Tether's own and names
/// nothing but the server, so the model can pass it on to the person who must act.
pub fn login_advice(server: &str) -> String {
    format!(
        "Ask the user or an operator to log in with `tether auth login {server}`; the server comes back after the login."
    )
}

/// The server was shut down.
pub fn stopped(server: &str) -> String {
    format!("Server {server:?} has been stopped; the call was not sent. Do not retry it.")
}

/// No such server.
pub fn unknown(server: &str) -> String {
    format!(
        "Server {server:?} is not configured; the call was not sent. Do not retry it; use another tool."
    )
}

/// For operators: why and for how long the breaker opened.
pub fn breaker_opened_detail(for_ms: Millis, reason: OpenReason) -> String {
    let why = match reason {
        OpenReason::Failures(1) => "after a transport failure".to_string(),
        OpenReason::Failures(n) => format!("after {n} consecutive transport failures"),
        OpenReason::ProbeFailed => "after its test call failed".into(),
        OpenReason::ReconnectFailed => "after a reconnect attempt failed".into(),
    };
    let verb = match reason {
        OpenReason::Failures(_) => "opened",
        _ => "re-opened",
    };
    format!("circuit breaker {verb} for {} {why}", secs(for_ms))
}

/// Who asked, for operator details.
pub fn source(source: ReconnectSource) -> &'static str {
    match source {
        ReconnectSource::Operator => "an operator",
        ReconnectSource::Agent => "the agent",
        ReconnectSource::Probe => "a probe",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up_with_a_minimum_of_one() {
        assert_eq!(ceil_secs(0), 1);
        assert_eq!(ceil_secs(1), 1);
        assert_eq!(ceil_secs(1_000), 1);
        assert_eq!(ceil_secs(1_001), 2);
        assert_eq!(ceil_secs(41_200), 42);
    }

    #[test]
    fn operator_seconds_are_whole_when_exact() {
        assert_eq!(secs(60_000), "60 s");
        assert_eq!(secs(1_500), "1.5 s");
        assert_eq!(secs(0), "0 s");
    }

    #[test]
    fn reconnecting_message_matches_the_documented_wording() {
        assert_eq!(
            reconnecting(
                "files",
                Some(&Fault::TransportClosed("broken pipe".into())),
                Some(1_200)
            ),
            "Server \"files\" is reconnecting after its connection closed; the call was not sent. Wait about 2 s and retry."
        );
        assert_eq!(
            reconnecting("files", None, None),
            "Server \"files\" is connecting; the call was not sent. Wait a few seconds and retry."
        );
    }

    #[test]
    fn breaker_open_message_matches_the_documented_wording() {
        assert_eq!(
            breaker_open("files", OpenReason::Failures(3), 41_001),
            "Server \"files\" is failing (circuit open after 3 consecutive transport failures); the call was not sent. Wait about 42 s and retry."
        );
    }

    #[test]
    fn breaker_details_match_the_documented_wording() {
        assert_eq!(
            breaker_opened_detail(60_000, OpenReason::Failures(3)),
            "circuit breaker opened for 60 s after 3 consecutive transport failures"
        );
        assert_eq!(
            breaker_opened_detail(120_000, OpenReason::ProbeFailed),
            "circuit breaker re-opened for 120 s after its test call failed"
        );
    }

    #[test]
    fn only_timeouts_say_timed_out() {
        let faults = [
            Fault::SpawnFailed("timed out".into()),
            Fault::HandshakeFailed("timed out".into()),
            Fault::AuthRequired(401),
            Fault::NotMcpEndpoint("timed out".into()),
            Fault::ProcessExited(Some(1)),
            Fault::ProcessExited(None),
            Fault::TransportClosed("timed out".into()),
            Fault::SessionExpired,
            Fault::KeepaliveFailed("timed out".into()),
        ];
        for fault in faults {
            assert!(!fault_phrase(&fault).contains("timed out"), "{fault:?}");
        }
        assert!(fault_phrase(&Fault::HandshakeTimedOut).contains("timed out"));
    }

    #[test]
    fn fault_text_from_the_host_never_reaches_the_model() {
        let secret = "https://user:hunter2@example.invalid/mcp?token=abc";
        for fault in [
            Fault::SpawnFailed(secret.into()),
            Fault::HandshakeFailed(secret.into()),
            Fault::NotMcpEndpoint(secret.into()),
            Fault::TransportClosed(secret.into()),
            Fault::KeepaliveFailed(secret.into()),
        ] {
            let message = reconnecting("s", Some(&fault), Some(1_000));
            assert!(!message.contains("hunter2"), "{message}");
        }
    }

    #[test]
    fn every_message_names_the_server_and_says_the_call_was_not_sent() {
        let messages = [
            reconnecting("files", None, Some(3_000)),
            breaker_open("files", OpenReason::ProbeFailed, 1),
            breaker_probing("files"),
            parked(
                "files",
                "parked: its process could not be started",
                RECONNECT_ADVICE,
            ),
            stopped("files"),
            unknown("files"),
        ];
        for m in messages {
            assert!(m.starts_with("Server \"files\" "), "{m}");
            assert!(m.contains("the call was not sent"), "{m}");
        }
        assert!(login_advice("files").contains("`tether auth login files`"));
    }
}
