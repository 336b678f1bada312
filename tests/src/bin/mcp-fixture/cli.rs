//! Command line, behaviour settings and exit codes.
//!
//! The behaviour flags and the keys of `control.json` are one struct ([`Behaviour`]): clap
//! parses it from flags, serde overlays `control.json` on it (a key present there wins, `null`
//! clears an optional setting), so the two can never drift apart.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Args, Parser, ValueEnum};
use serde::{Deserialize, Serialize};

/// Exit codes; tests assert them, so they never change meaning.
pub mod exit_code {
    /// The transport failed to start or serve (bind error, broken stdio, ...).
    pub const SERVE_FAILED: u8 = 1;
    // 2 is clap's usage error; 3 is `--crash-at-startup`'s default code (see the flag).
    /// `--crash-after-calls` and `--crash-after-answers`.
    pub const CRASH_AFTER_CALLS: i32 = 4;
    /// `--crash-after-ms`.
    pub const CRASH_AFTER_MS: i32 = 5;
    /// `--fail-initializes` on stdio.
    pub const FAIL_INITIALIZE: i32 = 6;
    /// `--flap`.
    pub const FLAP: i32 = 7;
}

#[derive(Parser, Debug)]
#[command(
    name = "mcp-fixture",
    about = "Fault-injecting MCP server for Tether's tests",
    after_help = "Exit codes: 0 clean end of input, 1 serve failed, 2 usage, 3 (or CODE) \
                  --crash-at-startup, 4 --crash-after-calls/--crash-after-answers, \
                  5 --crash-after-ms, 6 --fail-initializes (stdio), 7 --flap, \
                  and the code given to the exit_now tool."
)]
pub struct Cli {
    #[arg(long, value_enum)]
    pub transport: Transport,
    /// Address for http/sse; port 0 picks one, printed as `listening on ADDR` on stdout.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: SocketAddr,
    /// Persists across respawns: starts, initializes, calls.log, pid, control.json.
    #[arg(long)]
    pub state_dir: PathBuf,
    #[command(flatten)]
    pub behaviour: Behaviour,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// Newline-delimited JSON-RPC on stdin/stdout.
    Stdio,
    /// Streamable HTTP at `/mcp`.
    Http,
    /// Legacy HTTP+SSE (2024-11-05): `GET /sse`, `POST /messages?sessionId=`.
    Sse,
}

/// What a Streamable HTTP request with an unknown `Mcp-Session-Id` gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(try_from = "u16", into = "u16")]
pub enum UnknownSession {
    /// 404 Not Found, as the spec says.
    #[default]
    #[value(name = "404")]
    NotFound,
    /// 400 with an id-less JSON-RPC error body, as some SDKs answer.
    #[value(name = "400")]
    BadRequest,
}

impl TryFrom<u16> for UnknownSession {
    type Error = String;
    fn try_from(status: u16) -> Result<Self, String> {
        match status {
            404 => Ok(Self::NotFound),
            400 => Ok(Self::BadRequest),
            other => Err(format!(
                "http_unknown_session must be 404 or 400, not {other}"
            )),
        }
    }
}

impl From<UnknownSession> for u16 {
    fn from(value: UnknownSession) -> u16 {
        match value {
            UnknownSession::NotFound => 404,
            UnknownSession::BadRequest => 400,
        }
    }
}

/// Behaviour flags; the same names with `_` are the keys of `control.json`.
#[derive(Args, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Behaviour {
    /// Advertised tools (comma-separated); default: all but `env`.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub tools: Option<Vec<String>>,
    /// Exit with CODE (default 3) before serving anything.
    #[arg(long, value_name = "CODE", num_args = 0..=1, default_missing_value = "3")]
    pub crash_at_startup: Option<i32>,
    /// Streamable HTTP: answer each request with one JSON body when it is done, not an event
    /// stream (a long call then holds its POST without even response headers).
    #[arg(long)]
    pub json_response: bool,
    /// Sleep T ms before serving anything (a server slow to start, e.g. `npx` fetching it).
    #[arg(long, value_name = "T")]
    pub startup_delay_ms: Option<u64>,
    /// Exit(4) once this process has executed N calls, before answering the Nth.
    #[arg(long, value_name = "N")]
    pub crash_after_calls: Option<u64>,
    /// Exit(4) just after answering this process's Nth call.
    #[arg(long, value_name = "N")]
    pub crash_after_answers: Option<u64>,
    /// Exit(5) T ms after the process started.
    #[arg(long, value_name = "T")]
    pub crash_after_ms: Option<u64>,
    /// The first K initializes, counted across restarts, fail: exit(6) on stdio, HTTP 500 on
    /// http/sse.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub fail_initializes: u64,
    /// Answer initialize, then exit(7) right after `notifications/initialized`.
    #[arg(long)]
    pub flap: bool,
    /// Answer `ping` with -32601 (method not found).
    #[arg(long)]
    pub ping_unsupported: bool,
    /// Ignore SIGTERM, and keep running after stdin closes (stdio): only SIGKILL stops it.
    #[arg(long)]
    pub stubborn: bool,
    /// At startup, leave a long-lived child (`sleep 3600`, pid in `grandchild.pid`) that
    /// outlives this process unless its process group is killed.
    #[arg(long)]
    pub spawn_grandchild: bool,
    /// At startup, leave a daemon (`sleep 3600` in a session of its own, pid in `daemon.pid`):
    /// it has left the process group, as a `tmux` server does, and outlives this process.
    #[arg(long)]
    pub spawn_daemon: bool,
    /// Every tool call waits T ms before running.
    #[arg(long, value_name = "T", default_value_t = 0)]
    pub slow_ms: u64,
    /// Also offer N generated tools, `gen_0` to `gen_<N-1>`, each answering as `echo` does (for
    /// benchmarks of servers with many tools).
    #[arg(long, value_name = "N", default_value_t = 0)]
    #[serde(default)]
    pub generated_tools: usize,
    /// Serve `tools/list` in pages of N tools (0: one page).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub page_size: usize,
    /// Offer the `env` tool (returns the process environment).
    #[arg(long)]
    pub print_env: bool,
    /// Tool calls run (and are logged), but each answer is replaced by garbage: in turn, a
    /// line that is not JSON, JSON that is not JSON-RPC, and an answer with an id no request
    /// has (see garbage.rs). The caller must time out or fail the call cleanly.
    #[arg(long)]
    pub garbage: bool,
    /// Streamable HTTP: answer the first K `tools/call` POSTs of this process with HTTP
    /// `http_fail_status` without running them; the session lives on.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub http_fail_calls: u64,
    /// Streamable HTTP: answer the first K `ping` POSTs of this process with HTTP
    /// `http_fail_status` and an HTML page, as a proxy in front of a restarting server would.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub http_fail_pings: u64,
    /// The status `http_fail_calls` and `http_fail_pings` answer with (default 500).
    #[arg(long, value_name = "STATUS")]
    pub http_fail_status: Option<u16>,
    /// Streamable HTTP answer to an unknown session id.
    #[arg(long, value_enum, default_value = "404")]
    pub http_unknown_session: UnknownSession,
    /// Streamable HTTP: answer every request that carries a session id with this status, as a
    /// server that forgot its sessions (404) or revoked the client's credentials (401, 403).
    #[arg(long, value_name = "STATUS")]
    pub http_reject_sessions: Option<u16>,
    /// Offer prompts with these names (comma-separated); given at start, the server advertises
    /// prompts (with list changes), and `control.json` may change the names later.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub prompts: Option<Vec<String>>,
    /// Offer resources with these URIs; given at start, the server advertises resources (with
    /// list changes and subscriptions).
    #[arg(long, value_delimiter = ',', value_name = "URIS")]
    pub resources: Option<Vec<String>>,
    /// Offer these resource templates (RFC 6570, e.g. `fixture://items/{id}`).
    #[arg(long, value_delimiter = ',', value_name = "TEMPLATES")]
    pub templates: Option<Vec<String>>,
    /// Send `notifications/resources/updated` for each URI added to this list (through
    /// `control.json`) to the sessions subscribed to it.
    #[arg(long, value_delimiter = ',', value_name = "URIS")]
    pub updated: Option<Vec<String>>,
    /// Tell clients this about using the server (`instructions` at `initialize` and
    /// `server/discover`).
    #[arg(long, value_name = "TEXT")]
    pub instructions: Option<String>,
    /// Speak protocol 2026-07-28 only: `server/discover`, no `initialize`, no `ping`, change
    /// notifications on `subscriptions/listen` streams only.
    #[arg(long)]
    pub modern_only: bool,
    /// Send each message added to this list (through `control.json`) as a `warning` log
    /// message to every session, if the level set (`logging/setLevel`; `info` until then)
    /// lets it through.
    #[arg(long, value_delimiter = ',', value_name = "MESSAGES")]
    pub logs: Option<Vec<String>>,
    /// The same as a `debug` log message.
    #[arg(long, value_delimiter = ',', value_name = "MESSAGES")]
    pub debug_logs: Option<Vec<String>>,
}

impl Behaviour {
    /// These settings with the keys of a `control.json` object laid over them.
    pub fn overlaid(
        &self,
        control: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Self, String> {
        let serde_json::Value::Object(mut merged) =
            serde_json::to_value(self).map_err(|e| e.to_string())?
        else {
            unreachable!("Behaviour serializes to an object");
        };
        for (key, value) in control {
            merged.insert(key.clone(), value.clone());
        }
        serde_json::from_value(serde_json::Value::Object(merged)).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_overrides_and_clears() {
        let cli = Behaviour {
            crash_after_calls: Some(2),
            slow_ms: 10,
            ..Behaviour::default()
        };
        let control = serde_json::json!({"crash_after_calls": null, "flap": true, "tools": ["echo"], "http_unknown_session": 400});
        let merged = cli.overlaid(control.as_object().unwrap()).unwrap();
        assert_eq!(merged.crash_after_calls, None);
        assert_eq!(merged.slow_ms, 10);
        assert!(merged.flap);
        assert_eq!(merged.tools, Some(vec!["echo".to_owned()]));
        assert_eq!(merged.http_unknown_session, UnknownSession::BadRequest);
        let typo = serde_json::json!({"flapp": true});
        assert!(cli.overlaid(typo.as_object().unwrap()).is_err());
    }
}
