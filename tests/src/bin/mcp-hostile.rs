//! A hostile MCP server on stdio, written against the wire (no SDK), so it can send what no SDK
//! would: answers larger than any limit, lines without end, invalid tools, notification floods,
//! and requests to the client. Tests drive Tether against it.
//!
//! `mcp-hostile MODE [ARG...]`, modes:
//! - `huge-answer BYTES [id-last]`: the `big` tool answers with BYTES of text; with `id-last`
//!   the response's `id` comes after its `result` (as some SDKs write it).
//! - `endless-line`: the `big` tool starts its answer and never ends it: bytes without a
//!   newline until the reader goes away.
//! - `huge-tools PAGES BYTES`: tools/list has PAGES pages, each one tool with a BYTES description.
//! - `bad-tools`: tools/list has a tool with an empty name and one with no name among good ones.
//! - `list-changed-flood N FILE`: after `initialized`, N `notifications/tools/list_changed`;
//!   every tools/list received appends a line to FILE.
//! - `log-flood N BYTES`: after `initialized`, N `notifications/message` of BYTES each.
//! - `verbatim`: the `big` tool answers with JSON a writer would not write back the same way
//!   ([`VERBATIM`]; with the argument `error: true`, an error result alike).
//! - `sampling [BYTES]`: the `big` tool asks the client for `sampling/createMessage` (a message
//!   of BYTES of text, if given) and answers with what the client said (its error message, or
//!   its result). A call with a progress token gets progress 1 before the question and 2 after
//!   the answer.
//! - `numbered-logs N`: the `big` tool sends N `notifications/message` (`info`, data 0 to N-1)
//!   as fast as it can, then answers.
//! - `lone-surrogate`: the `big` tool answers with text ending in an unpaired surrogate escape
//!   (`\ud83d`), as JavaScript's `JSON.stringify` writes an emoji cut in half.
//!
//! Every mode also offers the `echo` tool (returns its `text`).

use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

type Out = Arc<Mutex<std::io::Stdout>>;

/// `verbatim`'s results: an escaped `é` and `/`, a number with a trailing zero, a member no
/// protocol generation defines.
const VERBATIM: &str = r#"{"content":[{"type":"text","text":"caf\u00e9 \/"}],"structuredContent":{"n":1.50},"x-note":"kept"}"#;
const VERBATIM_ERROR: &str = r#"{"content":[{"type":"text","text":"caf\u00e9 \/"}],"structuredContent":{"n":1.50},"isError":true}"#;

fn send(out: &Out, message: &Value) {
    let mut out = out.lock().unwrap();
    let _ = writeln!(out, "{message}");
    let _ = out.flush();
}

fn tool(name: &str, description: &str) -> Value {
    json!({"name": name, "description": description, "inputSchema": {"type": "object"}})
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().cloned().unwrap_or_default();
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    let number = |i: usize| arg(i).parse::<usize>().unwrap_or(0);
    let out: Out = Arc::new(Mutex::new(std::io::stdout()));
    // Answers to our own requests (sampling), by id.
    let answers: Arc<Mutex<Vec<Value>>> = Arc::default();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return };
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let id = message.get("id").cloned();
        let method = message.get("method").and_then(Value::as_str).unwrap_or("");
        if method.is_empty() {
            answers.lock().unwrap().push(message.clone());
            continue;
        }
        let reply = |result: Value| {
            send(
                &out,
                &json!({"jsonrpc": "2.0", "id": id.clone(), "result": result}),
            )
        };
        match method {
            "initialize" => {
                let version = message["params"]["protocolVersion"].clone();
                reply(json!({
                    "protocolVersion": version,
                    "capabilities": {"tools": {"listChanged": true}, "logging": {}},
                    "serverInfo": {"name": "mcp-hostile", "version": "1"}
                }));
            }
            "notifications/initialized" => match mode.as_str() {
                "list-changed-flood" => {
                    for _ in 0..number(1) {
                        send(
                            &out,
                            &json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}),
                        );
                    }
                }
                "log-flood" => {
                    let data = "x".repeat(number(2));
                    for i in 0..number(1) {
                        send(
                            &out,
                            &json!({"jsonrpc": "2.0", "method": "notifications/message",
                                    "params": {"level": "info", "data": format!("{i} {data}")}}),
                        );
                    }
                }
                _ => {}
            },
            "ping" => reply(json!({})),
            "tools/list" => {
                if mode == "list-changed-flood" {
                    let mut file = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(arg(2))
                        .unwrap();
                    let _ = writeln!(file, "tools/list");
                }
                let echo = tool("echo", "Returns its text.");
                match mode.as_str() {
                    "bad-tools" => reply(json!({"tools": [
                        echo,
                        {"name": "", "description": "empty name", "inputSchema": {"type": "object"}},
                        {"description": "no name", "inputSchema": {"type": "object"}},
                        tool("good", "A good tool."),
                    ]})),
                    "huge-tools" => {
                        let page: usize = message["params"]["cursor"]
                            .as_str()
                            .and_then(|c| c.parse().ok())
                            .unwrap_or(0);
                        let mut result = json!({"tools": [
                            tool(&format!("t{page}"), &"d".repeat(number(2)))
                        ]});
                        if page + 1 < number(1) {
                            result["nextCursor"] = json!((page + 1).to_string());
                        }
                        reply(result);
                    }
                    _ => reply(json!({"tools": [echo, tool("big", "Answers big.")]})),
                }
            }
            "tools/call" => {
                let name = message["params"]["name"].as_str().unwrap_or("");
                if name == "echo" {
                    let text = message["params"]["arguments"]["text"].clone();
                    reply(json!({"content": [{"type": "text", "text": text}]}));
                    continue;
                }
                match mode.as_str() {
                    "closes-stdout" => {
                        // Closes its end of the pipe and lives on, deaf to its stdin closing:
                        // only a signal ends it.
                        // SAFETY: closes this process's own stdout; nothing writes to it after.
                        unsafe {
                            libc::close(1);
                        }
                        loop {
                            std::thread::sleep(std::time::Duration::from_secs(3600));
                        }
                    }
                    "huge-answer" => {
                        let text = "y".repeat(number(1));
                        let line = if arg(2) == "id-last" {
                            format!(
                                "{{\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\"{text}\"}}]}},\"jsonrpc\":\"2.0\",\"id\":{}}}",
                                id.clone().unwrap_or(Value::Null)
                            )
                        } else {
                            json!({"jsonrpc": "2.0", "id": id.clone(),
                                   "result": {"content": [{"type": "text", "text": text}]}})
                            .to_string()
                        };
                        send_raw(&out, line.as_bytes(), true);
                    }
                    "numbered-logs" => {
                        for i in 0..number(1) {
                            send(
                                &out,
                                &json!({"jsonrpc": "2.0", "method": "notifications/message",
                                        "params": {"level": "info", "data": i}}),
                            );
                        }
                        reply(json!({"content": [{"type": "text", "text": "logged"}]}));
                    }
                    "lone-surrogate" => {
                        let id = id.clone().unwrap_or(Value::Null);
                        let line = format!(
                            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"Hi \ud83d"}}]}}}}"#
                        );
                        send_raw(&out, line.as_bytes(), true);
                    }
                    "verbatim" => {
                        let error = message["params"]["arguments"]["error"] == json!(true);
                        let result = if error { VERBATIM_ERROR } else { VERBATIM };
                        let id = id.clone().unwrap_or(Value::Null);
                        let line =
                            format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{result}}}");
                        send_raw(&out, line.as_bytes(), true);
                    }
                    "endless-line" => {
                        let chunk = vec![b'z'; 1 << 16];
                        let out = out.clone();
                        let start = format!(
                            "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\"",
                            id.clone().unwrap_or(Value::Null)
                        );
                        std::thread::spawn(move || {
                            send_raw(&out, start.as_bytes(), false);
                            loop {
                                if !send_raw(&out, &chunk, false) {
                                    return;
                                }
                            }
                        });
                    }
                    "sampling" => {
                        let out = out.clone();
                        let answers = answers.clone();
                        let text = match number(1) {
                            0 => "hi".to_string(),
                            bytes => "z".repeat(bytes),
                        };
                        let token = message["params"]["_meta"]["progressToken"].clone();
                        let progress = move |out: &Out, progress: u32| {
                            if !token.is_null() {
                                send(
                                    out,
                                    &json!({"jsonrpc": "2.0", "method": "notifications/progress",
                                            "params": {"progressToken": token, "progress": progress}}),
                                );
                            }
                        };
                        std::thread::spawn(move || {
                            progress(&out, 1);
                            send(
                                &out,
                                &json!({"jsonrpc": "2.0", "id": "sample-1", "method": "sampling/createMessage",
                                        "params": {"messages": [{"role": "user", "content": {"type": "text", "text": text}}],
                                                   "maxTokens": 10}}),
                            );
                            let deadline =
                                std::time::Instant::now() + std::time::Duration::from_secs(10);
                            let answer = loop {
                                if let Some(answer) = answers.lock().unwrap().pop() {
                                    break answer;
                                }
                                if std::time::Instant::now() > deadline {
                                    break json!({"error": {"message": "no answer to sampling/createMessage"}});
                                }
                                std::thread::sleep(std::time::Duration::from_millis(10));
                            };
                            let text = answer["error"]["message"]
                                .as_str()
                                .map(|m| format!("sampling refused: {m}"))
                                .unwrap_or_else(|| format!("sampling answered: {answer}"));
                            progress(&out, 2);
                            send(
                                &out,
                                &json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": text}]}}),
                            );
                        });
                    }
                    _ => reply(json!({"content": [{"type": "text", "text": "big"}]})),
                }
            }
            _ => {
                if id.is_some() {
                    send(
                        &out,
                        &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "method not found"}}),
                    );
                }
            }
        }
    }
}

/// Writes bytes as they are; `false` once the reader is gone.
fn send_raw(out: &Out, bytes: &[u8], newline: bool) -> bool {
    let mut out = out.lock().unwrap();
    let ok = out.write_all(bytes).is_ok() && (!newline || out.write_all(b"\n").is_ok());
    ok && out.flush().is_ok()
}
