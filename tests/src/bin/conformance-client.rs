//! The client command the MCP conformance suite runs in its `client` mode, with Tether as the
//! client under test: it puts the suite's server (the URL the suite appends as the last
//! argument) behind `tether serve` on stdio, under the server's own names and pinned to the
//! protocol the scenario speaks (`MCP_CONFORMANCE_PROTOCOL_VERSION`), then, as an agent would,
//! lists the tools through Tether and calls each once with arguments made from its schema.
//!
//! Usage: `conformance-client --tether PATH_TO_TETHER URL`. Tether's files go to a temporary
//! directory (or `--work DIR`). Exits 0 when every call was answered (tool errors included),
//! 1 otherwise; what happened goes to stderr.
//!
//! Authorization scenarios: the suite's context (`MCP_CONFORMANCE_CONTEXT`) becomes the
//! server's `oauth` table (a pre-registered client; client credentials), and the gateway's
//! browser is this program's `browse URL` mode, which follows the authorization server's
//! redirects back to Tether as a person's browser would.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, JsonObject, Tool};
use serde_json::{Value, json};
use tokio::process::Command;

/// How long one call may take (the suite's sse-retry resumes after half a second).
const CALL_LIMIT: Duration = Duration::from_secs(20);

#[tokio::main]
async fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("browse") {
        return browse(std::env::args().nth(2).unwrap_or_default()).await;
    }
    let mut args = std::env::args().skip(1);
    let (mut tether, mut work, mut url) = (None, None, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--tether" => tether = args.next().map(PathBuf::from),
            "--work" => work = args.next().map(PathBuf::from),
            other => url = Some(other.to_string()),
        }
    }
    let (Some(tether), Some(url)) = (tether, url) else {
        eprintln!("usage: conformance-client --tether PATH [--work DIR] URL");
        return ExitCode::from(2);
    };
    let scratch;
    let work = match work {
        Some(dir) => dir,
        None => {
            scratch =
                std::env::temp_dir().join(format!("conformance-client-{}", std::process::id()));
            scratch
        }
    };
    match run(&tether, &work, &url).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("conformance-client: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(tether: &Path, work: &Path, url: &str) -> Result<(), String> {
    std::fs::create_dir_all(work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let protocol =
        std::env::var("MCP_CONFORMANCE_PROTOCOL_VERSION").unwrap_or_else(|_| "2025-11-25".into());
    let protocol = if protocol.as_str() >= "2026-07-28" {
        "2026-07-28"
    } else {
        "2025-11-25"
    };
    let config = work.join("tether.toml");
    let mut text = format!(
        "[servers.up]\nurl = {}\ntype = \"streamable-http\"\nprefix = \"\"\nprotocol = \"{protocol}\"\n",
        toml_string(url)
    );
    text += &oauth_table();
    let browser = std::env::current_exe()
        .map_err(|e| format!("finding this program: {e}"))?
        .display()
        .to_string();
    std::fs::write(&config, text).map_err(|e| format!("writing the config: {e}"))?;
    let mut child = Command::new(tether)
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--state-file")
        .arg(work.join("state.json"))
        .arg("--log-dir")
        .arg(work.join("logs"))
        .args(["--startup-wait", "15s"])
        .env("RUST_LOG", "info,tether=debug,rmcp=warn")
        // Tokens stay in this run's directory; logins go through `browse`.
        .env("XDG_STATE_HOME", work.join("state"))
        .env("BROWSER", format!("{browser} browse"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", tether.display()))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let stdin = child.stdin.take().ok_or("no stdin")?;
    let client =
        ().serve((stdout, stdin))
            .await
            .map_err(|e| format!("an MCP session with tether: {e}"))?;
    // A server behind authorization shows its tools once the login is done.
    let deadline = tokio::time::Instant::now() + CALL_LIMIT;
    let tools = loop {
        let tools = tokio::time::timeout(CALL_LIMIT, client.list_all_tools())
            .await
            .map_err(|_| "tools/list through tether timed out".to_string())?
            .map_err(|e| format!("tools/list through tether: {e}"))?;
        if !tools.is_empty() || tokio::time::Instant::now() > deadline {
            break tools;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if tools.is_empty() {
        eprintln!(
            "conformance-client: no tools came through tether (its logs: {})",
            work.join("logs").display()
        );
    }
    eprintln!(
        "conformance-client: tools through tether: {:?}",
        tools.iter().map(|t| t.name.as_ref()).collect::<Vec<_>>()
    );
    let mut failures = Vec::new();
    for tool in &tools {
        let mut params = CallToolRequestParams::new(tool.name.to_string());
        params = params.with_arguments(arguments_for(tool));
        match tokio::time::timeout(CALL_LIMIT, client.call_tool(params)).await {
            Ok(Ok(result)) => eprintln!(
                "conformance-client: {} answered: {}",
                tool.name,
                serde_json::to_string(&result.content).unwrap_or_default()
            ),
            Ok(Err(error)) => failures.push(format!("{}: {error}", tool.name)),
            Err(_) => failures.push(format!("{}: no answer within {CALL_LIMIT:?}", tool.name)),
        }
    }
    let _ = client.cancel().await;
    // Stdin closed: tether shuts down on its own.
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
    match failures.is_empty() {
        true => Ok(()),
        false => Err(failures.join("; ")),
    }
}

/// Arguments that satisfy a tool's schema: each required property with a value of its type.
fn arguments_for(tool: &Tool) -> JsonObject {
    let schema = &tool.input_schema;
    let properties = schema.get("properties").and_then(Value::as_object);
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut arguments = JsonObject::new();
    for name in required {
        let kind = properties
            .and_then(|p| p.get(name))
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("string");
        let value = match kind {
            "number" | "integer" => json!(2),
            "boolean" => json!(true),
            "object" => json!({}),
            "array" => json!([]),
            _ => json!("test"),
        };
        arguments.insert(name.to_string(), value);
    }
    arguments
}

/// The server's `oauth` table from the scenario's context: a pre-registered client, or the
/// client credentials grant.
fn oauth_table() -> String {
    // The suite's clients present this client ID metadata document (it never fetches it), as
    // an operator would the document they publish; used only where the authorization server
    // takes such documents. Scenarios without a context (`basic-cimd`) get only this.
    let mut table =
        "client_metadata_url = \"https://conformance-test.local/client-metadata.json\"\n"
            .to_string();
    let context = std::env::var("MCP_CONFORMANCE_CONTEXT")
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .unwrap_or_default();
    for key in ["client_id", "client_secret"] {
        if let Some(value) = context.get(key).and_then(Value::as_str) {
            table += &format!("{key} = {}\n", toml_string(value));
        }
    }
    let name = context
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if name.starts_with("auth/client-credentials") {
        table += "grant = \"client_credentials\"\n";
    }
    format!("[servers.up.oauth]\n{table}")
}

/// A browser that follows redirects: the authorization server's (which approves at once) back
/// to Tether's loopback listener.
async fn browse(url: String) -> ExitCode {
    match reqwest::get(&url).await {
        Ok(answer) => {
            eprintln!(
                "conformance-client browse: {} ({})",
                answer.status(),
                answer.url()
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("conformance-client browse: {error}");
            ExitCode::FAILURE
        }
    }
}

/// A TOML basic string.
fn toml_string(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}
