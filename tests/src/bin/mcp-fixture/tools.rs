//! The fixture's tools: definitions (with input schemas), argument parsing and execution.

use std::{sync::Arc, time::Duration};

use rmcp::{
    RoleServer,
    model::{
        CallToolResult, ContentBlock, JsonObject, ProgressNotificationParam, Tool, ToolAnnotations,
    },
    service::RequestContext,
};
use serde_json::{Value, json};

use crate::{cli::Behaviour, fixture};

/// All tools, offered unless `tools` says otherwise; `env` only with `print_env`.
const ALL_TOOLS: &[&str] = &[
    "echo",
    "add",
    "side_effect",
    "slow",
    "hang",
    "exit_now",
    "fail",
    "env",
    "confirm",
    "burst",
    "blob",
];
/// The largest result `blob` makes (64 MB).
const MAX_BLOB: usize = 64 << 20;
/// How often `slow` reports progress when the request carried a progress token.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// The tool names advertised under these settings, in a stable order.
pub fn advertised(settings: &Behaviour) -> Vec<&'static str> {
    // `burst` and `blob` only when asked for: the default set stays what tests count on.
    let wanted = |name: &str| match &settings.tools {
        Some(list) => list.iter().any(|t| t == name),
        None => !matches!(name, "burst" | "blob"),
    };
    ALL_TOOLS
        .iter()
        .copied()
        .filter(|name| wanted(name) && (*name != "env" || settings.print_env))
        .filter(|name| *name != "confirm" || settings.modern_only)
        .collect()
}

/// The tool a name stands for: a generated tool (`gen_<i>`, see `--generated-tools`) is `echo`.
pub fn resolve<'a>(name: &'a str, settings: &Behaviour) -> Option<&'a str> {
    let generated = name
        .strip_prefix("gen_")
        .and_then(|i| i.parse::<usize>().ok())
        .is_some_and(|i| i < settings.generated_tools);
    if generated {
        return Some("echo");
    }
    advertised(settings).contains(&name).then_some(name)
}

/// Every tool's definition under these settings: the advertised ones, then the generated ones.
pub fn definitions(settings: &Behaviour) -> Vec<Tool> {
    let mut tools: Vec<Tool> = advertised(settings).into_iter().map(definition).collect();
    tools.extend((0..settings.generated_tools).map(|i| {
        let mut tool = definition("echo");
        tool.name = format!("gen_{i}").into();
        tool
    }));
    tools
}

pub fn definition(name: &str) -> Tool {
    let (description, schema) = match name {
        "echo" => (
            "Returns its text.",
            object_schema(json!({"text": {"type": "string"}}), &["text"]),
        ),
        "add" => (
            "Returns a + b.",
            object_schema(
                json!({"a": {"type": "number"}, "b": {"type": "number"}}),
                &["a", "b"],
            ),
        ),
        "side_effect" => (
            "Records label in calls.log and returns \"done\"; not idempotent.",
            object_schema(json!({"label": {"type": "string"}}), &["label"]),
        ),
        "slow" => (
            "Sleeps ms milliseconds, reporting progress every 100 ms, then answers.",
            object_schema(json!({"ms": {"type": "integer", "minimum": 0}}), &["ms"]),
        ),
        "hang" => ("Never answers.", object_schema(json!({}), &[])),
        "exit_now" => (
            "The server process exits with code mid-call.",
            object_schema(json!({"code": {"type": "integer"}}), &["code"]),
        ),
        "fail" => (
            "Always returns a tool error.",
            object_schema(json!({}), &[]),
        ),
        "env" => (
            "Returns the server's environment as a JSON object.",
            object_schema(json!({}), &[]),
        ),
        "blob" => (
            "Returns `bytes` bytes of text (for benchmarks: a result of a chosen size).",
            object_schema(
                json!({"bytes": {"type": "integer", "minimum": 0, "maximum": MAX_BLOB}}),
                &["bytes"],
            ),
        ),
        "burst" => (
            "Sends n progress notifications at once, as fast as it can, then answers.",
            object_schema(json!({"n": {"type": "integer", "minimum": 0}}), &["n"]),
        ),
        "confirm" => (
            "Asks the client to confirm (an InputRequiredResult, 2026-07-28), then answers with the \
             confirmation and the echoed request state.",
            object_schema(json!({}), &[]),
        ),
        other => unreachable!("no tool named {other}"),
    };
    let tool = Tool::new(name.to_owned(), description, Arc::new(schema));
    match name {
        "add" => tool.annotate(ToolAnnotations::new().read_only(true)),
        "side_effect" => tool.annotate(
            ToolAnnotations::new()
                .read_only(false)
                .destructive(false)
                .idempotent(false),
        ),
        _ => tool,
    }
}

fn object_schema(properties: Value, required: &[&str]) -> JsonObject {
    let schema = json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    });
    match schema {
        Value::Object(map) => map,
        _ => unreachable!(),
    }
}

/// A call with checked arguments.
pub enum Call {
    Echo {
        text: String,
    },
    Add {
        a: f64,
        b: f64,
        integers: Option<(i64, i64)>,
    },
    SideEffect,
    Slow {
        ms: u64,
    },
    Hang,
    Burst {
        n: u64,
    },
    Blob {
        bytes: usize,
    },
    ExitNow {
        code: i32,
    },
    Fail,
    Env,
    /// Handled by the handler: it needs the request's input responses.
    Confirm,
}

/// Checks the arguments of a call to `name` (an advertised tool).
pub fn parse(name: &str, args: &JsonObject) -> Result<Call, String> {
    let string = |key: &str| {
        args.get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("{name}: `{key}` must be a string"))
    };
    let number = |key: &str| {
        args.get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("{name}: `{key}` must be a number"))
    };
    Ok(match name {
        "echo" => Call::Echo {
            text: string("text")?,
        },
        "add" => Call::Add {
            a: number("a")?,
            b: number("b")?,
            integers: args
                .get("a")
                .and_then(Value::as_i64)
                .zip(args.get("b").and_then(Value::as_i64)),
        },
        "side_effect" => {
            string("label")?;
            Call::SideEffect
        }
        "slow" => Call::Slow {
            ms: args
                .get("ms")
                .and_then(Value::as_u64)
                .ok_or_else(|| "slow: `ms` must be a non-negative integer".to_owned())?,
        },
        "hang" => Call::Hang,
        "blob" => Call::Blob {
            bytes: args
                .get("bytes")
                .and_then(Value::as_u64)
                .and_then(|bytes| usize::try_from(bytes).ok())
                .filter(|bytes| *bytes <= MAX_BLOB)
                .ok_or_else(|| format!("blob: `bytes` must be an integer from 0 to {MAX_BLOB}"))?,
        },
        "burst" => Call::Burst {
            n: args
                .get("n")
                .and_then(Value::as_u64)
                .ok_or_else(|| "burst: `n` must be a non-negative integer".to_owned())?,
        },
        "exit_now" => Call::ExitNow {
            code: args
                .get("code")
                .and_then(Value::as_i64)
                .and_then(|code| i32::try_from(code).ok())
                .ok_or_else(|| "exit_now: `code` must be an integer".to_owned())?,
        },
        "fail" => Call::Fail,
        "env" => Call::Env,
        "confirm" => Call::Confirm,
        other => return Err(format!("unknown tool: {other}")),
    })
}

/// Runs a call; `hang` never returns and `exit_now` ends the process.
pub async fn run(call: Call, context: &RequestContext<RoleServer>) -> CallToolResult {
    let text = |text: String| CallToolResult::success(vec![ContentBlock::text(text)]);
    match call {
        Call::Echo { text: echoed } => text(echoed),
        Call::Add {
            integers: Some((a, b)),
            ..
        } if a.checked_add(b).is_some() => text((a + b).to_string()),
        Call::Add { a, b, .. } => text((a + b).to_string()),
        Call::SideEffect => text("done".to_owned()),
        Call::Slow { ms } => {
            slow(ms, context).await;
            text(format!("slept {ms} ms"))
        }
        Call::Hang => std::future::pending().await,
        Call::Burst { n } => {
            if let Some(token) = context.meta.get_progress_token() {
                for step in 1..=n {
                    let progress = ProgressNotificationParam::new(token.clone(), step as f64)
                        .with_total(n as f64);
                    if let Err(error) = context.peer.notify_progress(progress).await {
                        eprintln!("mcp-fixture: sending progress: {error}");
                    }
                }
            }
            text(format!("sent {n} progress notifications"))
        }
        Call::ExitNow { code } => fixture::exit(code, "exit_now tool"),
        Call::Fail => CallToolResult::error(vec![ContentBlock::text("fail tool always fails")]),
        // Printable and varied, so no transport compresses or special-cases it.
        Call::Blob { bytes } => {
            let mut blob = "abcdefghijklmnopqrstuvwxyz".repeat(bytes.div_ceil(26));
            blob.truncate(bytes);
            text(blob)
        }
        Call::Confirm => unreachable!("the handler answers confirm"),
        Call::Env => {
            let env: serde_json::Map<String, Value> = std::env::vars()
                .map(|(k, v)| (k, Value::String(v)))
                .collect();
            text(Value::Object(env).to_string())
        }
    }
}

/// Sleeps `ms`, sending `notifications/progress` every 100 ms if the caller asked for progress.
async fn slow(ms: u64, context: &RequestContext<RoleServer>) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(ms);
    let Some(token) = context.meta.get_progress_token() else {
        tokio::time::sleep_until(deadline).await;
        return;
    };
    let total = ms.div_ceil(PROGRESS_EVERY.as_millis() as u64) as f64;
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
    let mut step = 0.0;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return,
            _ = tick.tick() => {
                step += 1.0;
                let progress = ProgressNotificationParam::new(token.clone(), step).with_total(total);
                if let Err(error) = context.peer.notify_progress(progress).await {
                    eprintln!("mcp-fixture: sending progress: {error}");
                }
            }
        }
    }
}
