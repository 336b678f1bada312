//! Multi-round tool results (SEP-2322, 2026-07-28): the `test_input_required_result_*` tools
//! and prompt answer `InputRequiredResult` until the client retries with the `inputResponses`
//! they asked for, carrying `requestState` sealed with HMAC-SHA256 under a per-process random
//! key, so a client cannot forge or alter it.

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use rmcp::{
    ErrorData as McpError,
    model::{ClientCapabilities, InputRequest, InputRequests, InputRequiredResult, InputResponses},
};
use serde_json::{Map, Value, json};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

pub const PROMPT: &str = "test_input_required_result_prompt";

/// Seals and opens `requestState`: `base64url(json) "." base64url(hmac(json))`.
pub struct Sealer {
    key: [u8; 32],
}

impl Sealer {
    pub fn new() -> Result<Self, String> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key)
            .map_err(|error| format!("drawing the requestState key: {error}"))?;
        Ok(Sealer { key })
    }

    fn mac(&self) -> HmacSha256 {
        <HmacSha256 as KeyInit>::new_from_slice(&self.key).expect("HMAC takes keys of any length")
    }

    pub fn seal(&self, state: &Value) -> String {
        let payload = state.to_string();
        let mut mac = self.mac();
        mac.update(payload.as_bytes());
        let tag = mac.finalize().into_bytes();
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(tag)
        )
    }

    /// The state sealed in `token`, if its tag verifies and it was issued by `tool`.
    pub fn open(&self, token: &str, tool: &str) -> Result<Map<String, Value>, McpError> {
        let rejected = |why: &str| {
            McpError::invalid_params(
                format!("requestState rejected: {why}"),
                Some(json!({"requestState": token})),
            )
        };
        let (payload, tag) = token
            .split_once('.')
            .ok_or_else(|| rejected("not a sealed state"))?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| rejected("payload is not base64url"))?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| rejected("tag is not base64url"))?;
        let mut mac = self.mac();
        mac.update(&payload);
        mac.verify_slice(&tag)
            .map_err(|_| rejected("integrity check failed"))?;
        let state: Map<String, Value> =
            serde_json::from_slice(&payload).map_err(|_| rejected("payload is not an object"))?;
        if state.get("tool").and_then(Value::as_str) != Some(tool) {
            return Err(rejected("issued for another request"));
        }
        Ok(state)
    }
}

/// What one round of a multi-round call ends with.
pub enum Round {
    Complete(String),
    Ask(InputRequiredResult),
}

/// The client capabilities an input request needs.
#[derive(Clone, Copy)]
pub enum Need {
    Elicitation,
    Sampling,
    Roots,
}

impl Need {
    fn declared(self, capabilities: &ClientCapabilities) -> bool {
        match self {
            Need::Elicitation => capabilities.elicitation.is_some(),
            Need::Sampling => capabilities.sampling.is_some(),
            Need::Roots => capabilities.roots.is_some(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Need::Elicitation => "elicitation",
            Need::Sampling => "sampling",
            Need::Roots => "roots",
        }
    }
}

/// Fails with -32021 naming those of `needs` that `capabilities` lacks, if any.
pub fn require(capabilities: &ClientCapabilities, needs: &[Need]) -> Result<(), McpError> {
    let missing: Vec<Need> = needs
        .iter()
        .copied()
        .filter(|need| !need.declared(capabilities))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing_capabilities(&missing))
    }
}

/// -32021 with `data.requiredCapabilities` an object of capability objects, e.g.
/// `{"sampling": {}}` (what `sep-2575-server-rejects-undeclared-capability` checks).
fn missing_capabilities(needs: &[Need]) -> McpError {
    let required: Map<String, Value> = needs
        .iter()
        .map(|need| (need.name().to_string(), json!({})))
        .collect();
    match serde_json::from_value::<ClientCapabilities>(Value::Object(required)) {
        Ok(required) => McpError::missing_required_client_capability(required),
        Err(error) => McpError::internal_error(format!("capabilities: {error}"), None),
    }
}

/// One input request of the fixture, by its key.
struct Ask {
    key: &'static str,
    need: Need,
    request: Value,
}

fn elicit(key: &'static str, message: &str, property: &str, kind: &str) -> Ask {
    Ask {
        key,
        need: Need::Elicitation,
        request: json!({
            "method": "elicitation/create",
            "params": {
                "mode": "form",
                "message": message,
                "requestedSchema": {
                    "type": "object",
                    "properties": {property: {"type": kind}},
                    "required": [property],
                },
            },
        }),
    }
}

fn sample(key: &'static str, question: &str, max_tokens: u32) -> Ask {
    Ask {
        key,
        need: Need::Sampling,
        request: json!({
            "method": "sampling/createMessage",
            "params": {
                "messages": [{"role": "user", "content": {"type": "text", "text": question}}],
                "maxTokens": max_tokens,
            },
        }),
    }
}

fn roots(key: &'static str) -> Ask {
    Ask {
        key,
        need: Need::Roots,
        request: json!({"method": "roots/list", "params": {}}),
    }
}

fn ask(asks: &[&Ask], state: Option<String>) -> Result<Round, McpError> {
    let mut requests = InputRequests::new();
    for ask in asks {
        let request: InputRequest =
            serde_json::from_value(ask.request.clone()).map_err(|error| {
                McpError::internal_error(format!("input request {}: {error}", ask.key), None)
            })?;
        requests.insert(ask.key.to_string(), request);
    }
    Ok(Round::Ask(InputRequiredResult::new(Some(requests), state)))
}

/// The form content of an accepted elicitation answer; `None` if the user declined or
/// cancelled. An answer that is not an elicitation result at all is invalid params.
fn elicited<'a>(key: &str, answer: &'a Value) -> Result<Option<&'a Map<String, Value>>, McpError> {
    let action = answer
        .get("action")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid_answer(key, "an elicitation result with an action"))?;
    if action != "accept" {
        return Ok(None);
    }
    answer
        .get("content")
        .and_then(Value::as_object)
        .map(Some)
        .ok_or_else(|| invalid_answer(key, "accepted elicitation content"))
}

fn elicited_string(key: &str, answer: &Value, field: &str) -> Result<String, McpError> {
    Ok(match elicited(key, answer)? {
        Some(content) => content
            .get(field)
            .map(|value| {
                value
                    .as_str()
                    .map_or_else(|| value.to_string(), str::to_string)
            })
            .ok_or_else(|| invalid_answer(key, &format!("a `{field}` field")))?,
        None => format!("(no {field}: declined)"),
    })
}

/// The text of a sampling answer (`content` is one block or, since 2025-11-25, a list).
fn sampled(key: &str, answer: &Value) -> Result<String, McpError> {
    let content = answer
        .get("content")
        .ok_or_else(|| invalid_answer(key, "a sampling result with content"))?;
    let blocks = match content {
        Value::Array(blocks) => blocks.iter().collect(),
        block => vec![block],
    };
    let text: Vec<&str> = blocks
        .iter()
        .filter_map(|block| block.get("text").and_then(Value::as_str))
        .collect();
    if text.is_empty() {
        return Err(invalid_answer(key, "a sampling result with text content"));
    }
    Ok(text.join(" "))
}

fn listed_roots(key: &str, answer: &Value) -> Result<String, McpError> {
    let roots = answer
        .get("roots")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid_answer(key, "a roots/list result"))?;
    let uris: Vec<&str> = roots
        .iter()
        .filter_map(|root| root.get("uri").and_then(Value::as_str))
        .collect();
    Ok(if uris.is_empty() {
        "no roots".to_string()
    } else {
        uris.join(", ")
    })
}

fn invalid_answer(key: &str, expected: &str) -> McpError {
    McpError::invalid_params(
        format!("inputResponses.{key} is not {expected}"),
        Some(json!({"inputResponse": key})),
    )
}

/// One round of the multi-round tool or prompt `name`.
pub fn round(
    sealer: &Sealer,
    name: &str,
    capabilities: &ClientCapabilities,
    responses: Option<&InputResponses>,
    state: Option<&str>,
) -> Result<Round, McpError> {
    let empty = InputResponses::new();
    let responses = responses.unwrap_or(&empty);
    let answer = |key: &str| responses.get(key);
    let user_name = elicit("user_name", "What is your name?", "name", "string");
    let capital = sample("capital_question", "What is the capital of France?", 100);
    let client_roots = roots("client_roots");
    match name {
        "test_input_required_result_elicitation" => {
            require(capabilities, &[Need::Elicitation])?;
            // Missing or wrong keys: ask again rather than fail (input-required-result-missing-input-response).
            match answer(user_name.key) {
                None => ask(&[&user_name], None),
                Some(answer) => Ok(Round::Complete(format!(
                    "Hello, {}!",
                    elicited_string(user_name.key, answer, "name")?
                ))),
            }
        }
        "test_input_required_result_sampling" => {
            require(capabilities, &[Need::Sampling])?;
            match answer(capital.key) {
                None => ask(&[&capital], None),
                Some(answer) => Ok(Round::Complete(format!(
                    "The model answered: {}",
                    sampled(capital.key, answer)?
                ))),
            }
        }
        "test_input_required_result_list_roots" => {
            require(capabilities, &[Need::Roots])?;
            match answer(client_roots.key) {
                None => ask(&[&client_roots], None),
                Some(answer) => Ok(Round::Complete(format!(
                    "The client's roots: {}",
                    listed_roots(client_roots.key, answer)?
                ))),
            }
        }
        "test_input_required_result_request_state"
        | "test_input_required_result_tampered_state" => {
            require(capabilities, &[Need::Elicitation])?;
            let confirm = elicit("confirm", "Please confirm", "ok", "boolean");
            let Some(token) = state else {
                let sealed = sealer.seal(&json!({"tool": name, "step": "confirm"}));
                return ask(&[&confirm], Some(sealed));
            };
            // A state that fails its check is an error, never a fresh start (tampered-state).
            sealer.open(token, name)?;
            match answer(confirm.key) {
                None => ask(&[&confirm], Some(token.to_string())),
                Some(answer) => Ok(Round::Complete(format!(
                    "state-ok: requestState verified, ok = {}",
                    elicited_string(confirm.key, answer, "ok")?
                ))),
            }
        }
        "test_input_required_result_multiple_inputs" => {
            let greeting = sample("greeting", "Generate a greeting", 50);
            let all = [&user_name, &greeting, &client_roots];
            require(
                capabilities,
                &[Need::Elicitation, Need::Sampling, Need::Roots],
            )?;
            let Some(token) = state else {
                return ask(&all, Some(sealer.seal(&json!({"tool": name}))));
            };
            sealer.open(token, name)?;
            let missing: Vec<&Ask> = all
                .into_iter()
                .filter(|a| answer(a.key).is_none())
                .collect();
            if !missing.is_empty() {
                return ask(&missing, Some(token.to_string()));
            }
            let got = |ask: &Ask| answer(ask.key).expect("checked above");
            Ok(Round::Complete(format!(
                "Name: {}; greeting: {}; roots: {}",
                elicited_string(user_name.key, got(&user_name), "name")?,
                sampled(greeting.key, got(&greeting))?,
                listed_roots(client_roots.key, got(&client_roots))?
            )))
        }
        "test_input_required_result_multi_round" => {
            require(capabilities, &[Need::Elicitation])?;
            let step1 = elicit("step1", "Step 1: What is your name?", "name", "string");
            let step2 = elicit(
                "step2",
                "Step 2: What is your favorite color?",
                "color",
                "string",
            );
            let Some(token) = state else {
                return ask(
                    &[&step1],
                    Some(sealer.seal(&json!({"tool": name, "round": 1}))),
                );
            };
            let sealed = sealer.open(token, name)?;
            match sealed.get("round").and_then(Value::as_u64) {
                Some(1) => match answer(step1.key) {
                    None => ask(&[&step1], Some(token.to_string())),
                    Some(answer) => {
                        let user = elicited_string(step1.key, answer, "name")?;
                        let next = sealer.seal(&json!({"tool": name, "round": 2, "name": user}));
                        ask(&[&step2], Some(next))
                    }
                },
                Some(2) => match answer(step2.key) {
                    None => ask(&[&step2], Some(token.to_string())),
                    Some(answer) => Ok(Round::Complete(format!(
                        "{}'s favorite color is {}.",
                        sealed.get("name").and_then(Value::as_str).unwrap_or("?"),
                        elicited_string(step2.key, answer, "color")?
                    ))),
                },
                _ => Err(McpError::invalid_params(
                    "requestState names no round",
                    None,
                )),
            }
        }
        "test_input_required_result_capabilities" => {
            // Ask only for what the request's capabilities allow (input-required-result-capability-check).
            let allowed: Vec<&Ask> = [&user_name, &capital, &client_roots]
                .into_iter()
                .filter(|a| a.need.declared(capabilities))
                .collect();
            if allowed.is_empty() {
                // Nothing it may ask for: any one of them would do.
                return Err(missing_capabilities(&[Need::Sampling]));
            }
            let missing: Vec<&Ask> = allowed
                .iter()
                .copied()
                .filter(|a| answer(a.key).is_none())
                .collect();
            if !missing.is_empty() {
                return ask(&missing, None);
            }
            Ok(Round::Complete(format!(
                "Answered: {}",
                allowed.iter().map(|a| a.key).collect::<Vec<_>>().join(", ")
            )))
        }
        PROMPT => {
            require(capabilities, &[Need::Elicitation])?;
            let context = elicit(
                "user_context",
                "What context should the prompt use?",
                "context",
                "string",
            );
            match answer(context.key) {
                None => ask(&[&context], None),
                Some(answer) => Ok(Round::Complete(format!(
                    "Answer with this context in mind: {}",
                    elicited_string(context.key, answer, "context")?
                ))),
            }
        }
        _ => Err(McpError::invalid_params(
            format!("{name} is not a multi-round tool"),
            None,
        )),
    }
}

pub fn is_multi_round(name: &str) -> bool {
    name.starts_with("test_input_required_result_") && name != PROMPT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_state_opens_only_unaltered_and_for_its_tool() {
        let sealer = Sealer::new().unwrap();
        let token = sealer.seal(&json!({"tool": "t", "round": 1}));
        assert_eq!(sealer.open(&token, "t").unwrap()["round"], 1);
        assert!(sealer.open(&format!("{token}-TAMPERED"), "t").is_err());
        assert!(sealer.open(&token, "other").is_err());
        assert!(Sealer::new().unwrap().open(&token, "t").is_err());
    }
}
