//! CLI commands that talk to a running gateway's admin API.
//!
//! The gateway is found from `--admin ADDR` (its token from `--token`/`TETHER_ADMIN_TOKEN`, else
//! from the running gateway's state file that names the same address), from the state file
//! `tether serve` wrote (`--state-file`), or among the running gateways
//! ([`state_file::running`]): the one there is, or the one `--pid` names. Without `--admin`,
//! the token is the state file's.
//!
//! Exit codes: 0 done, 1 the request failed or was refused, 2 a usage error, 3 the gateway
//! cannot be found or reached.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use comfy_table::{Table, presets};
use futures::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tether::Event;
use tether::ReloadReport;
use tether::admin::api;
use tether::policy::{PolicyNotice, ShadowReport, SwapPath};

use crate::args::AdminArgs;
use crate::state_file;

/// How long to wait for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request may take (a swap compiles the component; a reload may stop servers).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// Why a command did not succeed, and so its exit code (see [`crate::exit`]).
#[derive(Debug)]
enum Failure {
    /// The request failed or was refused.
    Failed(String),
    /// The command does not say which gateway, or how to reach it.
    Usage(String),
    /// The gateway cannot be reached or found.
    Unreachable(String),
}

impl Failure {
    fn report(self) -> ExitCode {
        let (message, code) = match self {
            Failure::Failed(message) => (message, crate::exit::REFUSED),
            Failure::Usage(message) => (message, crate::exit::USAGE),
            Failure::Unreachable(message) => (message, crate::exit::UNREACHABLE),
        };
        eprintln!("error: {message}");
        ExitCode::from(code)
    }
}

fn finish(result: Result<(), Failure>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}

/// A gateway's admin API and the token for it.
struct Gateway {
    addr: SocketAddr,
    token: String,
    http: reqwest::Client,
}

/// The state file of the gateway the command is for: `--state-file`, else the running gateway
/// (`--pid` picks one of several).
fn state_path(admin: &AdminArgs) -> Result<PathBuf, Failure> {
    if let Some(path) = &admin.state_file {
        return Ok(path.clone());
    }
    let running = state_file::running();
    let mut chosen: Vec<&state_file::Running> = running
        .iter()
        .filter(|gateway| admin.pid.is_none_or(|pid| gateway.state.pid == pid))
        .collect();
    match (chosen.len(), admin.pid) {
        (1, _) => Ok(chosen.remove(0).path.clone()),
        (0, Some(pid)) => Err(Failure::Unreachable(format!(
            "no running gateway has pid {pid} (`tether gateways` lists them)"
        ))),
        // Nothing runs: name where the HTTP gateway's file would be.
        (0, None) => Ok(state_file::default_path()),
        (_, _) => Err(Failure::Usage(format!(
            "{} gateways are running ({}); pick one with --pid PID or --state-file FILE (`tether gateways` lists them)",
            chosen.len(),
            chosen
                .iter()
                .map(|gateway| format!("pid {} on {}", gateway.state.pid, gateway.state.serves))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// `tether gateways`: every running gateway.
pub fn gateways(json: bool) -> ExitCode {
    let running = state_file::running();
    if json {
        // Without tokens: the list is for picking one.
        let listed: Vec<serde_json::Value> = running
            .iter()
            .map(|gateway| {
                serde_json::json!({
                    "pid": gateway.state.pid,
                    "serves": gateway.state.serves,
                    "admin": gateway.state.addr,
                    "config": gateway.state.config,
                    "state_file": gateway.path,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(listed));
        return ExitCode::SUCCESS;
    }
    if running.is_empty() {
        println!("no gateway is running");
        return ExitCode::SUCCESS;
    }
    let mut table = Table::new();
    table.load_style(presets::NOTHING);
    table.set_header(["PID", "SERVES", "ADMIN", "CONFIG", "STATE FILE"]);
    for gateway in &running {
        table.add_row([
            gateway.state.pid.to_string(),
            gateway.state.serves.clone(),
            gateway.state.addr.to_string(),
            gateway
                .state
                .config
                .as_ref()
                .map_or_else(|| "-".into(), |c| c.display().to_string()),
            gateway.path.display().to_string(),
        ]);
    }
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    for line in table.lines() {
        println!("{}", line.trim_end());
    }
    ExitCode::SUCCESS
}

fn locate(admin: &AdminArgs) -> Result<Gateway, Failure> {
    let token_given = admin.token.clone().filter(|t| !t.is_empty());
    let (addr, token) = match (admin.admin, token_given) {
        // Address and token given: no state file is looked at (several gateways may run).
        (Some(addr), Some(token)) => (addr, token),
        (Some(addr), None) => {
            // The token of the gateway at that address: its state file's.
            let named = match &admin.state_file {
                Some(path) => state_file::read(path)
                    .ok()
                    .filter(|state| state.addr == addr),
                None => state_file::running()
                    .into_iter()
                    .map(|running| running.state)
                    .find(|state| state.addr == addr),
            };
            let Some(state) = named else {
                return Err(Failure::Usage(format!(
                    "no admin token for {addr}: pass --token or set TETHER_ADMIN_TOKEN (no running gateway's state file names {addr})"
                )));
            };
            (addr, state.token)
        }
        (None, _) => {
            let path = state_path(admin)?;
            let state = match state_file::read(&path) {
                Ok(state) => state,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Failure::Unreachable(format!(
                        "no running gateway found (looked in {}); start `tether serve` or pass --admin",
                        path.display()
                    )));
                }
                Err(error) => {
                    return Err(Failure::Unreachable(format!(
                        "cannot read the state file {}: {error}",
                        path.display()
                    )));
                }
            };
            if !state_file::is_running(&path, &state) {
                return Err(Failure::Unreachable(format!(
                    "no running gateway found: {} was written by process {}, which is no longer running; start `tether serve` or pass --admin",
                    path.display(),
                    state.pid
                )));
            }
            // The state file's own token: TETHER_ADMIN_TOKEN may be set for another gateway.
            (state.addr, state.token)
        }
    };
    let http = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .no_proxy()
        .build()
        .map_err(|e| Failure::Failed(format!("cannot set up an HTTP client: {e}")))?;
    Ok(Gateway { addr, token, http })
}

impl Gateway {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, self.url(path))
            .bearer_auth(&self.token)
    }

    fn transport_failure(&self, error: reqwest::Error) -> Failure {
        if error.is_connect() {
            Failure::Unreachable(format!(
                "cannot reach the gateway at {}: {}; is `tether serve` running?",
                self.addr,
                root_cause(&error)
            ))
        } else if error.is_timeout() {
            Failure::Unreachable(format!(
                "the gateway at {} did not answer in time",
                self.addr
            ))
        } else {
            Failure::Unreachable(format!(
                "lost the connection to the gateway at {}: {}",
                self.addr,
                root_cause(&error)
            ))
        }
    }

    /// Sends a request; answers its body, read as the admin API's type for it.
    async fn send<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<T, Failure> {
        let response = request
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|e| self.transport_failure(e))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| self.transport_failure(e))?;
        check_status(status, &body)?;
        serde_json::from_slice(&body).map_err(|e| {
            Failure::Failed(format!(
                "the gateway at {} answered something this CLI does not understand (another \
                 version?): {e}",
                self.addr
            ))
        })
    }
}

/// The innermost error's text (reqwest's own is only "error sending request").
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

fn check_status(status: reqwest::StatusCode, body: &[u8]) -> Result<(), Failure> {
    if status.is_success() {
        Ok(())
    } else {
        Err(refusal(status, body))
    }
}

/// What an unsuccessful answer means.
fn refusal(status: reqwest::StatusCode, body: &[u8]) -> Failure {
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return Failure::Failed(
            "the admin token was refused (check --token, TETHER_ADMIN_TOKEN or --state-file)"
                .into(),
        );
    }
    let message = serde_json::from_slice::<api::ApiError>(body)
        .map(|answer| answer.error)
        .unwrap_or_else(|_| String::from_utf8_lossy(body).trim().to_string());
    Failure::Failed(if message.is_empty() {
        format!("the gateway answered {status}")
    } else {
        message
    })
}

fn print_json(value: &impl Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("admin API types serialize")
    );
}

/// A value for a table cell or a line: `-` for nothing.
fn shown(value: Option<impl ToString>) -> String {
    match value.map(|v| v.to_string()) {
        Some(text) if !text.is_empty() => text,
        _ => "-".to_string(),
    }
}

/// An enum as the API spells it (`backing-off`).
fn spelled(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(text)) => text,
        Ok(other) => other.to_string(),
        Err(_) => "?".to_string(),
    }
}

/// "3m 12s ago" for an RFC 3339 time.
fn age(since: &str) -> String {
    match humantime::parse_rfc3339_weak(since) {
        Ok(then) => {
            let elapsed = SystemTime::now()
                .duration_since(then)
                .unwrap_or_default()
                .as_secs();
            format!(
                "{} ago",
                humantime::format_duration(Duration::from_secs(elapsed))
            )
        }
        Err(_) => since.to_string(),
    }
}

/// The status as a table (one row per server) below a line naming the policy.
fn status_text(status: &api::Status) -> String {
    let policy = &status.policy;
    let mut out = format!(
        "policy: {} {} ({}), contract {}\n",
        policy.name, policy.version, policy.label, policy.contract
    );
    if status.servers.is_empty() {
        out.push_str("no servers configured\n");
        return out;
    }
    let mut table = Table::new();
    table.load_style(presets::NOTHING);
    table.set_header([
        "NAME",
        "STATE",
        "TRANSPORT",
        "PID",
        "TOOLS",
        "BREAKER",
        "RETRIES",
        "LAST FAULT",
        "SINCE",
    ]);
    for server in &status.servers {
        table.add_row([
            server.name.clone(),
            spelled(&server.state),
            spelled(&server.transport),
            shown(server.pid),
            server.tools.to_string(),
            shown(server.breaker.as_ref().map(spelled)),
            shown(server.failures),
            shown(server.last_fault.as_ref()),
            age(&server.since),
        ]);
    }
    // Flush left, two spaces between columns.
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    for line in table.lines() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    // Name collisions fail closed: say what agents cannot see, and why.
    for server in status.servers.iter().filter(|s| !s.withheld.is_empty()) {
        out.push_str(&format!(
            "{}: withheld (another server or item claims the same name): {}\n",
            server.name,
            server.withheld.join(", ")
        ));
    }
    out
}

/// Sends the request `build` makes to the gateway and shows the answer: as JSON with
/// `--json`, else as `show` writes it.
async fn exchange<T: DeserializeOwned + Serialize>(
    admin: &AdminArgs,
    build: impl FnOnce(&Gateway) -> Result<reqwest::RequestBuilder, Failure>,
    show: impl FnOnce(&T),
) -> ExitCode {
    finish(
        async {
            let gateway = locate(admin)?;
            let answer: T = gateway.send(build(&gateway)?).await?;
            if admin.json {
                print_json(&answer);
            } else {
                show(&answer);
            }
            Ok(())
        }
        .await,
    )
}

pub async fn status(admin: &AdminArgs) -> ExitCode {
    exchange(
        admin,
        |gateway| Ok(gateway.request(reqwest::Method::GET, "/status")),
        |status: &api::Status| print!("{}", status_text(status)),
    )
    .await
}

pub async fn tools(admin: &AdminArgs) -> ExitCode {
    exchange(
        admin,
        |gateway| Ok(gateway.request(reqwest::Method::GET, "/tools")),
        |rows: &Vec<api::ToolRow>| print!("{}", tools_text(rows)),
    )
    .await
}

/// The dashboard's address, once the gateway has answered with this token. The token goes in
/// the fragment, which browsers do not send: the page reads it and sends it as a header.
pub async fn dashboard(admin: &AdminArgs) -> ExitCode {
    let result = async {
        let gateway = locate(admin)?;
        let _: api::Status = gateway
            .send(gateway.request(reqwest::Method::GET, "/status"))
            .await?;
        println!("{}#token={}", gateway.url("/ui"), gateway.token);
        Ok(())
    };
    finish(result.await)
}

fn tools_text(rows: &[api::ToolRow]) -> String {
    if rows.is_empty() {
        return "no server offers a tool now\n".to_string();
    }
    let mut table = Table::new();
    table.load_style(presets::NOTHING);
    table.set_header(["AGENTS SEE", "SERVER", "TOOL", "WHY"]);
    for row in rows {
        table.add_row([
            row.advertised.clone().unwrap_or_else(|| "-".to_string()),
            row.server.clone(),
            row.original.clone(),
            row.why.clone(),
        ]);
    }
    format!("{table}\n")
}

/// One event as a readable line.
fn event_line(timed: &api::TimedEvent) -> String {
    let time = humantime::parse_rfc3339_weak(&timed.time)
        .map(|t| humantime::format_rfc3339_seconds(t).to_string())
        .unwrap_or_default();
    let what = match &timed.event {
        Event::Lifecycle(e) => format!("{}: {} - {}", e.server, spelled(&e.state), e.detail),
        Event::Tools(change) => {
            let mut parts = Vec::new();
            if !change.added.is_empty() {
                parts.push(format!("+{}", change.added.join(" +")));
            }
            if !change.removed.is_empty() {
                parts.push(format!("-{}", change.removed.join(" -")));
            }
            format!(
                "{}: tools {} (generation {})",
                change.server,
                parts.join(" "),
                change.generation
            )
        }
        Event::Policy { notice } => match notice {
            PolicyNotice::Fault { error, .. } => format!("policy fault: {error}"),
            PolicyNotice::Recovered { policy } => format!("policy {policy} recovered"),
            PolicyNotice::FellBack { from, reason } => {
                format!("policy {from} replaced by the embedded default: {reason}")
            }
            PolicyNotice::Swapped { from, to } => format!("policy swapped: {from} -> {to}"),
            PolicyNotice::SettingsChanged { settings } => {
                format!("policy settings changed: {settings}")
            }
            PolicyNotice::ShadowStarted { policy } => format!("shadow policy {policy} started"),
            PolicyNotice::ShadowDiverged {
                policy,
                server,
                decision,
            } => format!("shadow policy {policy} decided otherwise on {server} ({decision})"),
            PolicyNotice::ShadowDropped { policy, reason } => {
                format!("shadow policy {policy} dropped: {reason}")
            }
        },
        Event::Lagged { missed } => {
            format!("(missed {missed} events: this client read too slowly)")
        }
        other => format!("{other:?}"),
    };
    if time.is_empty() {
        what
    } else {
        format!("{time}  {what}")
    }
}

pub async fn events(admin: &AdminArgs) -> ExitCode {
    finish(
        async {
            let gateway = locate(admin)?;
            let response = gateway
                .request(reqwest::Method::GET, "/events")
                .header(reqwest::header::ACCEPT, "text/event-stream")
                .send()
                .await
                .map_err(|e| gateway.transport_failure(e))?;
            let status = response.status();
            if !status.is_success() {
                let body = response.bytes().await.unwrap_or_default();
                return Err(refusal(status, &body));
            }
            eprintln!(
                "watching events from the gateway at {} (Ctrl-C to stop)",
                gateway.addr
            );
            let mut stream = sse_stream::SseStream::from_bytes_stream(response.bytes_stream());
            let interrupted = tokio::signal::ctrl_c();
            tokio::pin!(interrupted);
            loop {
                let next = tokio::select! {
                    _ = &mut interrupted => return Ok(()),
                    next = stream.next() => next,
                };
                match next {
                    None => {
                        eprintln!("the gateway closed the event stream");
                        return Ok(());
                    }
                    Some(Err(error)) => {
                        return Err(Failure::Unreachable(format!(
                            "lost the event stream from the gateway at {}: {}",
                            gateway.addr,
                            root_cause(&error)
                        )));
                    }
                    Some(Ok(sse)) => {
                        let Some(data) = sse.data else { continue };
                        if admin.json {
                            println!("{data}");
                        } else {
                            match serde_json::from_str::<api::TimedEvent>(&data) {
                                Ok(event) => println!("{}", event_line(&event)),
                                Err(_) => println!("{data}"),
                            }
                        }
                    }
                }
            }
        }
        .await,
    )
}

pub async fn reconnect(admin: &AdminArgs, name: &str) -> ExitCode {
    let path = format!("/reconnect/{}", percent_encode(name));
    exchange(
        admin,
        |gateway| Ok(gateway.request(reqwest::Method::POST, &path)),
        |answer: &api::Reconnecting| println!("reconnecting {}", answer.reconnecting),
    )
    .await
}

/// Percent-encodes text for a URL path segment or query value.
fn percent_encode(name: &str) -> String {
    let mut out = String::new();
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

pub async fn reload(admin: &AdminArgs) -> ExitCode {
    exchange(
        admin,
        |gateway| Ok(gateway.request(reqwest::Method::POST, "/reload")),
        |report: &ReloadReport| {
            println!("configuration reloaded");
            for (key, names) in [
                ("added", &report.added),
                ("removed", &report.removed),
                ("restarted", &report.restarted),
                ("unchanged", &report.unchanged),
            ] {
                let list = if names.is_empty() {
                    "-".to_string()
                } else {
                    names.join(", ")
                };
                println!("  {key:<10} {list}");
            }
            if report.policy_settings_changed {
                println!("  the policy runs with the file's new top-level `policy` settings");
            }
            for warning in &report.warnings {
                println!("warning: {warning}");
            }
        },
    )
    .await
}

/// A PUT of a component file to `route`, labelled with its file name.
fn upload(
    gateway: &Gateway,
    route: &str,
    file: &Path,
    force: bool,
) -> Result<reqwest::RequestBuilder, Failure> {
    let bytes = std::fs::read(file)
        .map_err(|e| Failure::Failed(format!("cannot read {}: {e}", file.display())))?;
    let label = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| file.display().to_string());
    Ok(gateway
        .request(
            reqwest::Method::PUT,
            &format!("{route}?label={}&force={force}", percent_encode(&label)),
        )
        .header(reqwest::header::CONTENT_TYPE, "application/wasm")
        .body(bytes))
}

pub async fn policy_swap(admin: &AdminArgs, file: &Path, force: bool) -> ExitCode {
    exchange(
        admin,
        |gateway| upload(gateway, "/policy", file, force),
        print_swap,
    )
    .await
}

pub async fn policy_set(admin: &AdminArgs, settings: &str) -> ExitCode {
    let parsed = match serde_json::from_str::<serde_json::Value>(settings) {
        Ok(parsed) if parsed.is_object() => parsed,
        Ok(_) => {
            return finish(Err(Failure::Failed(
                "the settings must be a JSON object, e.g. '{\"breaker\": {\"open_ms\": 30000}}'"
                    .into(),
            )));
        }
        Err(e) => {
            return finish(Err(Failure::Failed(format!(
                "the settings are not valid JSON: {e}"
            ))));
        }
    };
    exchange(
        admin,
        |gateway| {
            Ok(gateway
                .request(reqwest::Method::PATCH, "/policy/settings")
                .json(&parsed))
        },
        |answer: &api::Settings| println!("policy settings are now {}", answer.settings),
    )
    .await
}

fn print_swap(answer: &api::Swapped) {
    let policy = &answer.policy;
    println!(
        "policy swapped: now running {} {} ({}, digest {})",
        policy.name, policy.version, policy.label, policy.digest
    );
    println!(
        "state carried by {}",
        match answer.swap.path {
            SwapPath::Handover => "a handover (another implementation)",
            SwapPath::Events => "events (a contract 0.1 policy)",
            SwapPath::Snapshot => "snapshot (same implementation)",
        }
    );
    for what in &answer.swap.not_carried {
        println!("not carried: {what}");
    }
    for name in &answer.swap.breaks_invariants {
        println!("warning: it breaks Tether's invariant {name} (swapped with --force)");
    }
}

/// `tether policy swap --from-shadow`.
pub async fn policy_promote(admin: &AdminArgs, force: bool) -> ExitCode {
    let path = format!("/policy/promote?force={force}");
    exchange(
        admin,
        |gateway| Ok(gateway.request(reqwest::Method::POST, &path)),
        print_swap,
    )
    .await
}

/// `tether policy shadow [FILE] [--drop]`.
pub async fn policy_shadow(admin: &AdminArgs, file: Option<&Path>, drop: bool) -> ExitCode {
    if drop {
        return exchange(
            admin,
            |gateway| Ok(gateway.request(reqwest::Method::DELETE, "/policy/shadow")),
            |answer: &api::ShadowDropped| match answer.dropped {
                true => println!("shadow policy dropped"),
                false => println!("no shadow policy was running"),
            },
        )
        .await;
    }
    exchange(
        admin,
        |gateway| match file {
            Some(file) => upload(gateway, "/policy/shadow", file, false),
            None => Ok(gateway.request(reqwest::Method::GET, "/policy/shadow")),
        },
        |answer: &api::Shadow| match &answer.shadow {
            Some(shadow) => print_shadow(shadow),
            None => println!("no shadow policy is running"),
        },
    )
    .await
}

fn print_shadow(shadow: &ShadowReport) {
    println!(
        "shadow policy {} ({} {}), given the live state by {}",
        shadow.label,
        shadow.name,
        shadow.version,
        spelled(&shadow.path)
    );
    for what in &shadow.not_carried {
        println!("not carried: {what}");
    }
    println!(
        "{} decisions compared, {} differ",
        shadow.decisions, shadow.divergences
    );
    for (kind, count) in &shadow.by_kind {
        println!("  {count:>6}  {kind}");
    }
    for (server, divergence) in &shadow.first_per_server {
        println!(
            "first on {server} ({}):\n    live:   {}\n    shadow: {}",
            divergence.kind, divergence.recorded, divergence.candidate
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_status_table_has_the_columns_and_one_row_per_server() {
        let status: api::Status = serde_json::from_value(json!({
            "policy": {"label": "embedded default policy", "name": "tether-default", "version": "0.1.0", "contract": "0.1.0", "digest": "ab", "settings": {}},
            "servers": [
                {"name": "files", "state": "healthy", "transport": "stdio", "pid": 42, "tools": 3,
                 "breaker": "closed", "failures": 0, "breaker_failures": 0, "tool_errors": 0, "last_fault": null,
                 "since": "2020-01-01T00:00:00Z", "detail": "", "reconnects": 0, "parks": 0},
                {"name": "web", "state": "parked", "transport": "streamable-http", "pid": null, "tools": 0,
                 "breaker": "open", "failures": 5, "breaker_failures": 5, "tool_errors": 0,
                 "last_fault": "MCP handshake timed out", "since": "2020-01-01T00:00:00Z", "detail": "",
                 "reconnects": 2, "parks": 1}
            ]
        }))
        .unwrap();
        let out = status_text(&status);
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with("policy: tether-default 0.1.0"),
            "{out}"
        );
        assert!(lines[1].starts_with("NAME"), "{out}");
        for column in [
            "STATE",
            "TRANSPORT",
            "PID",
            "TOOLS",
            "BREAKER",
            "RETRIES",
            "LAST FAULT",
            "SINCE",
        ] {
            assert!(lines[1].contains(column), "{out}");
        }
        assert!(lines[2].starts_with("files"), "{out}");
        assert!(lines[3].contains("MCP handshake timed out"), "{out}");
        assert!(lines[3].contains(" ago"), "{out}");
    }

    #[test]
    fn events_read_as_lines() {
        let read = |value| serde_json::from_value::<api::TimedEvent>(value).unwrap();
        let line = event_line(&read(
            json!({"kind": "lifecycle", "server": "a", "state": "parked", "detail": "gave up", "time": "2020-01-01T00:00:00.123Z"}),
        ));
        assert_eq!(line, "2020-01-01T00:00:00Z  a: parked - gave up");
        let line = event_line(&read(
            json!({"kind": "tools", "server": "a", "generation": 3, "added": ["a__x"], "removed": ["a__y"], "time": "x"}),
        ));
        assert_eq!(line, "a: tools +a__x -a__y (generation 3)");
        let line = event_line(&read(
            json!({"kind": "policy", "notice": {"kind": "swapped", "from": "a", "to": "b"}, "time": "x"}),
        ));
        assert_eq!(line, "policy swapped: a -> b");
    }

    #[test]
    fn server_names_are_escaped_in_paths() {
        assert_eq!(percent_encode("my server/1"), "my%20server%2F1");
    }
}
