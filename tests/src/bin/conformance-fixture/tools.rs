//! What each tool does when called (their definitions are in `catalog.rs`).

#![allow(deprecated)] // Logging and sampling are deprecated by SEP-2577 but still in the suite.

use std::time::Duration;

use rmcp::{
    ErrorData as McpError, RoleServer,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, LoggingLevel,
        ProgressNotificationParam, ResourceContents, ServerRequest,
    },
    service::RequestContext,
};
use serde_json::{Map, Value, json};

use crate::{
    catalog::DYNAMIC_TOOL,
    handler::{Handler, is_modern},
    mrtr,
    state::ListChange,
};

/// How long `test_reconnection` waits for the client to resume its closed stream.
const RECONNECT_PATIENCE: Duration = Duration::from_secs(10);

pub async fn call(
    handler: &Handler,
    request: CallToolRequestParams,
    context: RequestContext<RoleServer>,
) -> Result<CallToolResponse, McpError> {
    let shared = &handler.shared;
    let name = request.name.as_ref();
    if !shared.has_tool(name) {
        return Err(McpError::invalid_params(
            format!("unknown tool: {name}"),
            Some(json!({"name": name})),
        ));
    }
    if mrtr::is_multi_round(name) {
        let capabilities = context.client_capabilities().unwrap_or_default();
        return Ok(
            match mrtr::round(
                &shared.sealer,
                name,
                &capabilities,
                request.input_responses.as_ref(),
                request.request_state.as_deref(),
            )? {
                mrtr::Round::Complete(text) => text_result(text).into(),
                mrtr::Round::Ask(input) => input.into(),
            },
        );
    }
    let arguments = request.arguments.unwrap_or_default();
    // A tool that asks the client something answers a 2026-07-28 request for input first.
    let asked = Asked {
        context: &context,
        responses: request.input_responses.as_ref(),
    };
    let result = match name {
        "test_simple_text" => text_result("This is a simple text response for testing."),
        "test_image_content" => {
            CallToolResult::success(vec![ContentBlock::image(shared.png.clone(), "image/png")])
        }
        "test_audio_content" => {
            CallToolResult::success(vec![ContentBlock::audio(shared.wav.clone(), "audio/wav")])
        }
        "test_embedded_resource" => {
            CallToolResult::success(vec![ContentBlock::resource(text_contents(
                "test://embedded-resource",
                "text/plain",
                "This is an embedded resource content.",
            ))])
        }
        "test_multiple_content_types" => CallToolResult::success(vec![
            ContentBlock::text("Multiple content types test:"),
            ContentBlock::image(shared.png.clone(), "image/png"),
            ContentBlock::resource(text_contents(
                "test://mixed-content-resource",
                "application/json",
                r#"{"test":"data","value":123}"#,
            )),
        ]),
        "test_error_handling" => CallToolResult::error(vec![ContentBlock::text(
            "This intentionally returns an error for testing",
        )]),
        "test_tool_with_progress" => {
            // On the request's own stream and before the result: rmcp routes progress by token.
            if let Some(token) = context.meta.get_progress_token() {
                for (progress, message) in [(0.0, "started"), (50.0, "halfway"), (100.0, "done")] {
                    let mut param =
                        ProgressNotificationParam::new(token.clone(), progress).with_total(100.0);
                    param.message = Some(message.to_string());
                    context
                        .peer
                        .notify_progress(param)
                        .await
                        .map_err(|error| internal(format!("sending progress: {error}")))?;
                }
            }
            text_result("Progress test completed")
        }
        "test_tool_with_logging" | "test_logging_tool" => {
            for message in [
                "Tool execution started",
                "Tool processing data",
                "Tool execution completed",
            ] {
                handler.log(&context, LoggingLevel::Info, message).await?;
            }
            text_result("Logging test completed")
        }
        "test_sampling" => match sampling(&asked, &arguments).await {
            Ok(result) => result,
            Err(stop) => return stop.answer(),
        },
        "test_elicitation" => {
            let message = string_argument(&arguments, "message")?;
            let schema = json!({
                "type": "object",
                "properties": {
                    "username": {"type": "string", "description": "Your username"},
                    "email": {"type": "string", "format": "email", "description": "Your email address"},
                },
                "required": ["username", "email"],
            });
            let answer = match elicit(&asked, &message, schema).await {
                Ok(answer) => answer,
                Err(stop) => return stop.answer(),
            };
            text_result(format!(
                "User response: action={}, content={}",
                answer.get("action").and_then(Value::as_str).unwrap_or("?"),
                answer.get("content").cloned().unwrap_or(Value::Null)
            ))
        }
        "test_elicitation_sep1034_defaults" => {
            let answer = match elicit(
                &asked,
                "Please review your details (every field has a default)",
                sep1034_schema(),
            )
            .await
            {
                Ok(answer) => answer,
                Err(stop) => return stop.answer(),
            };
            text_result(format!("Elicitation completed: {answer}"))
        }
        "test_elicitation_sep1330_enums" => {
            let answer = match elicit(&asked, "Please pick some options", sep1330_schema()).await {
                Ok(answer) => answer,
                Err(stop) => return stop.answer(),
            };
            text_result(format!("Elicitation completed: {answer}"))
        }
        "test_reconnection" => {
            // The HTTP layer closes this call's stream (http.rs); answer once it was resumed.
            if let Some(session) = session_id(&context)
                && !is_modern(&context)
            {
                shared
                    .reconnections
                    .wait(&session, RECONNECT_PATIENCE)
                    .await;
            }
            text_result("Reconnection test completed successfully")
        }
        "json_schema_2020_12_tool" => {
            text_result(format!("Arguments received: {}", Value::Object(arguments)))
        }
        "test_missing_capability" => {
            let capabilities = context.client_capabilities().unwrap_or_default();
            mrtr::require(&capabilities, &[mrtr::Need::Sampling])?;
            text_result("Success")
        }
        "test_streaming_elicitation" => {
            // Streams a notification, never a request: 2026-07-28 forbids server-to-client
            // requests on a response stream (input requests go through InputRequiredResult).
            if let Some(token) = context.meta.get_progress_token() {
                let param = ProgressNotificationParam::new(token, 1.0).with_total(1.0);
                context
                    .peer
                    .notify_progress(param)
                    .await
                    .map_err(|error| internal(format!("sending progress: {error}")))?;
            }
            text_result("Streaming complete")
        }
        "test_trigger_tool_change" => toggle(handler, ListChange::Tools).await,
        "test_trigger_prompt_change" => toggle(handler, ListChange::Prompts).await,
        "test_update_watched_resource" => {
            let version = shared.bump_watched();
            shared.announce_watched().await;
            text_result(format!(
                "test://watched-resource is now at version {version}"
            ))
        }
        "test_custom_header" => text_result(format!(
            "Region: {}",
            string_argument(&arguments, "region")?
        )),
        DYNAMIC_TOOL => text_result("The dynamic tool ran."),
        _ => {
            return Err(internal(format!(
                "listed tool {name} has no implementation"
            )));
        }
    };
    Ok(result.into())
}

async fn toggle(handler: &Handler, change: ListChange) -> CallToolResult {
    let listed = handler.shared.toggle(change);
    handler.shared.announce(change).await;
    let what = match change {
        ListChange::Tools => "test_dynamic_tool",
        ListChange::Prompts => "test_dynamic_prompt",
    };
    text_result(format!(
        "{what} is now {}",
        if listed { "listed" } else { "unlisted" }
    ))
}

/// `sampling/createMessage`: on the call's own stream (2025-11-25), or as a request for input
/// (2026-07-28).
async fn sampling(
    asked: &Asked<'_>,
    arguments: &Map<String, Value>,
) -> Result<CallToolResult, Stop> {
    let prompt = string_argument(arguments, "prompt")?;
    let answer = asked
        .ask(json!({
            "method": "sampling/createMessage",
            "params": {
                "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
                "maxTokens": 100,
            },
        }))
        .await?;
    let text = match answer.get("content") {
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|block| block.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        Some(block) => block
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        None => String::new(),
    };
    Ok(text_result(format!("LLM response: {text}")))
}

async fn elicit(asked: &Asked<'_>, message: &str, requested_schema: Value) -> Result<Value, Stop> {
    asked
        .ask(json!({
            "method": "elicitation/create",
            "params": {"mode": "form", "message": message, "requestedSchema": requested_schema},
        }))
        .await
}

/// The key under which a tool that asks the client one thing asks it (2026-07-28).
const ASKED: &str = "client_request";

/// What a tool needs to ask its client something, on either wire.
struct Asked<'a> {
    context: &'a RequestContext<RoleServer>,
    /// A 2026-07-28 retry's answers.
    responses: Option<&'a rmcp::model::InputResponses>,
}

/// Why a tool stopped before its result.
enum Stop {
    Error(McpError),
    /// 2026-07-28: the client must answer this first, then retry.
    Input(rmcp::model::InputRequiredResult),
}

impl From<McpError> for Stop {
    fn from(error: McpError) -> Self {
        Stop::Error(error)
    }
}

impl Stop {
    fn answer(self) -> Result<CallToolResponse, McpError> {
        match self {
            Stop::Error(error) => Err(error),
            Stop::Input(input) => Ok(input.into()),
        }
    }
}

impl Asked<'_> {
    /// The client's answer to `request`: asked on the call's stream (2025-11-25), or taken from
    /// the retry's `inputResponses` after asking for it as a request for input (2026-07-28),
    /// as a server speaking both generations does.
    async fn ask(&self, request: Value) -> Result<Value, Stop> {
        if !is_modern(self.context) {
            return Ok(ask_client(self.context, request).await?);
        }
        if let Some(answer) = self.responses.and_then(|responses| responses.get(ASKED)) {
            return Ok(answer.clone());
        }
        let input: rmcp::model::InputRequest = serde_json::from_value(request)
            .map_err(|error| internal(format!("building a request for input: {error}")))?;
        Err(Stop::Input(
            rmcp::model::InputRequiredResult::from_input_requests(
                [(ASKED.to_string(), input)].into(),
            ),
        ))
    }
}

/// Sends a request to the client and answers its result as JSON. Sent from the handler's
/// task, so rmcp tags it with this call's request id and puts it on this call's SSE stream.
async fn ask_client(
    context: &RequestContext<RoleServer>,
    request: Value,
) -> Result<Value, McpError> {
    let method = request["method"].as_str().unwrap_or_default().to_string();
    let request: ServerRequest = serde_json::from_value(request)
        .map_err(|error| internal(format!("building {method}: {error}")))?;
    let answer = context
        .peer
        .send_request(request)
        .await
        .map_err(|error| internal(format!("{method} to the client: {error}")))?;
    serde_json::to_value(answer).map_err(|error| internal(format!("{method} answer: {error}")))
}

/// SEP-1034: every primitive kind, each with a default.
pub fn sep1034_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "Your name", "default": "John Doe"},
            "age": {"type": "integer", "description": "Your age", "minimum": 0, "maximum": 150, "default": 30},
            "score": {"type": "number", "description": "Your score", "minimum": 0.0, "maximum": 100.0, "default": 95.5},
            "status": {
                "type": "string",
                "description": "Your status",
                "enum": ["active", "inactive", "pending"],
                "default": "active",
            },
            "verified": {"type": "boolean", "description": "Whether you are verified", "default": true},
        },
    })
}

/// SEP-1330: single and multiple choice, with and without titles, plus the legacy form.
pub fn sep1330_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "untitledSingle": {
                "type": "string",
                "description": "Pick one (no titles)",
                "enum": ["option1", "option2", "option3"],
            },
            "titledSingle": {
                "type": "string",
                "description": "Pick one (with titles)",
                "oneOf": [
                    {"const": "value1", "title": "First Option"},
                    {"const": "value2", "title": "Second Option"},
                    {"const": "value3", "title": "Third Option"},
                ],
            },
            "legacyEnum": {
                "type": "string",
                "description": "Pick one (legacy enumNames)",
                "enum": ["opt1", "opt2", "opt3"],
                "enumNames": ["Option One", "Option Two", "Option Three"],
            },
            "untitledMulti": {
                "type": "array",
                "description": "Pick any (no titles)",
                "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
            },
            "titledMulti": {
                "type": "array",
                "description": "Pick any (with titles)",
                "items": {
                    "anyOf": [
                        {"const": "value1", "title": "First Choice"},
                        {"const": "value2", "title": "Second Choice"},
                        {"const": "value3", "title": "Third Choice"},
                    ],
                },
            },
        },
    })
}

fn string_argument(arguments: &Map<String, Value>, name: &str) -> Result<String, McpError> {
    arguments
        .get(name)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| {
            McpError::invalid_params(
                format!("argument `{name}` (a string) is required"),
                Some(json!({"argument": name})),
            )
        })
}

/// The `Mcp-Session-Id` the call came with (HTTP sessions only).
fn session_id(context: &RequestContext<RoleServer>) -> Option<String> {
    context
        .extensions
        .get::<axum::http::request::Parts>()?
        .headers
        .get("mcp-session-id")?
        .to_str()
        .ok()
        .map(str::to_string)
}

pub fn text_result(text: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text)])
}

pub fn text_contents(uri: &str, mime_type: &str, text: &str) -> ResourceContents {
    ResourceContents::TextResourceContents {
        uri: uri.to_string(),
        mime_type: Some(mime_type.to_string()),
        text: text.to_string(),
        meta: None,
    }
}

pub fn internal(message: String) -> McpError {
    McpError::internal_error(message, None)
}

#[cfg(test)]
mod tests {
    use rmcp::model::ElicitRequestParams;
    use serde_json::json;

    /// rmcp types elicitation schemas; the SEP-1034/1330 checks need them on the wire exactly
    /// as written, so they must survive its round trip unchanged.
    #[test]
    fn elicitation_schemas_survive_rmcp_typing() {
        for schema in [super::sep1034_schema(), super::sep1330_schema()] {
            let params = json!({"mode": "form", "message": "m", "requestedSchema": schema});
            let typed: ElicitRequestParams = serde_json::from_value(params.clone()).unwrap();
            assert_eq!(serde_json::to_value(typed).unwrap(), params);
        }
    }
}
