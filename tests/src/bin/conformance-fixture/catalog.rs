//! What the fixture lists: tools, prompts, resources and templates, written as JSON so each
//! definition reads like the wire and schemas stay verbatim, parsed once at start.
//!
//! Every tool and prompt has a description (the suite's `tools-list` and `prompts-list` fail
//! without one) and every tool name matches `^[A-Za-z0-9_.-]{1,128}$`.

use rmcp::model::{Prompt, Resource, ResourceTemplate, ServerCapabilities, Tool};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Listed only after `test_trigger_tool_change` toggled it on (and gone after the next one).
pub const DYNAMIC_TOOL: &str = "test_dynamic_tool";
/// Listed only after `test_trigger_prompt_change` toggled it on (and gone after the next one).
pub const DYNAMIC_PROMPT: &str = "test_dynamic_prompt";
pub const WATCHED_RESOURCE: &str = "test://watched-resource";
pub const TEMPLATE: &str = "test://template/{id}/data";

/// The parsed definitions, in listing order (`tools-list-deterministic-order` wants a stable
/// order, and `caching` reads whichever resource is listed first).
pub struct Catalog {
    pub capabilities: ServerCapabilities,
    pub tools: Vec<Tool>,
    pub dynamic_tool: Tool,
    pub prompts: Vec<Prompt>,
    pub dynamic_prompt: Prompt,
    pub resources: Vec<Resource>,
    pub templates: Vec<ResourceTemplate>,
}

impl Catalog {
    pub fn new() -> Result<Self, String> {
        Ok(Catalog {
            // Everything the scenarios look for, list_changed and subscriptions included.
            capabilities: serde_json::from_value(json!({
                "tools": {"listChanged": true},
                "prompts": {"listChanged": true},
                "resources": {"subscribe": true, "listChanged": true},
                "logging": {},
                "completions": {},
            }))
            .map_err(|error| format!("capabilities: {error}"))?,
            tools: parse_all("tool", tools())?,
            dynamic_tool: parse(
                "tool",
                tool(
                    DYNAMIC_TOOL,
                    "Appears and disappears when test_trigger_tool_change runs.",
                    empty(),
                ),
            )?,
            prompts: parse_all("prompt", prompts())?,
            dynamic_prompt: parse(
                "prompt",
                json!({"name": DYNAMIC_PROMPT, "description": "Appears and disappears when test_trigger_prompt_change runs."}),
            )?,
            resources: parse_all("resource", resources())?,
            templates: parse_all("resource template", templates())?,
        })
    }
}

fn parse<T: DeserializeOwned>(what: &str, value: Value) -> Result<T, String> {
    let name = value
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_string();
    serde_json::from_value(value).map_err(|error| format!("{what} {name}: {error}"))
}

fn parse_all<T: DeserializeOwned>(what: &str, values: Vec<Value>) -> Result<Vec<T>, String> {
    values.into_iter().map(|value| parse(what, value)).collect()
}

fn tool(name: &str, description: &str, input_schema: Value) -> Value {
    json!({"name": name, "description": description, "inputSchema": input_schema})
}

fn empty() -> Value {
    json!({"type": "object", "properties": {}})
}

fn one_string(property: &str, description: &str) -> Value {
    json!({
        "type": "object",
        "properties": {property: {"type": "string", "description": description}},
        "required": [property],
    })
}

/// `json-schema-2020-12` checks that this schema comes back from `tools/list` exactly as
/// written: `$schema`, `$defs` with an `$anchor`, composition, conditionals and
/// `additionalProperties: false`.
pub fn json_schema_2020_12() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": {
            "address": {
                "$anchor": "addressDef",
                "type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
            },
        },
        "properties": {
            "name": {"type": "string"},
            "address": {"$ref": "#/$defs/address"},
            "contactMethod": {"type": "string", "enum": ["phone", "email"]},
            "phone": {"type": "string"},
            "email": {"type": "string"},
        },
        "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
        "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
        "then": {"required": ["phone"]},
        "else": {"required": ["email"]},
        "additionalProperties": false,
    })
}

fn tools() -> Vec<Value> {
    vec![
        // Content types (tools-call-*).
        tool("test_simple_text", "Returns one text block.", empty()),
        tool("test_image_content", "Returns a 1x1 PNG image.", empty()),
        tool(
            "test_audio_content",
            "Returns a short silent WAV clip.",
            empty(),
        ),
        tool(
            "test_embedded_resource",
            "Returns an embedded text resource.",
            empty(),
        ),
        tool(
            "test_multiple_content_types",
            "Returns text, an image and an embedded resource together.",
            empty(),
        ),
        tool(
            "test_error_handling",
            "Always fails, as a tool result with isError (not a protocol error).",
            empty(),
        ),
        tool(
            "test_tool_with_progress",
            "Reports progress 0, 50 and 100 of 100 before answering.",
            empty(),
        ),
        tool(
            "test_tool_with_logging",
            "Logs three messages while it runs.",
            empty(),
        ),
        // Server-to-client requests on a 2025-11-25 session.
        tool(
            "test_sampling",
            "Asks the client's model to answer a prompt (sampling/createMessage).",
            one_string("prompt", "What to ask the model."),
        ),
        tool(
            "test_elicitation",
            "Asks the user for a username and an email (elicitation/create).",
            one_string("message", "What to tell the user."),
        ),
        tool(
            "test_elicitation_sep1034_defaults",
            "Elicits a form whose fields all have default values (SEP-1034).",
            empty(),
        ),
        tool(
            "test_elicitation_sep1330_enums",
            "Elicits a form with every kind of enum field (SEP-1330).",
            empty(),
        ),
        tool(
            "test_reconnection",
            "Closes its SSE response stream before answering; the answer arrives after the client resumes with GET and Last-Event-ID (SEP-1699).",
            empty(),
        ),
        tool(
            "json_schema_2020_12_tool",
            "Takes arguments described by a JSON Schema 2020-12 schema and echoes them.",
            json_schema_2020_12(),
        ),
        // 2026-07-28 diagnostics (server-stateless).
        tool(
            "test_missing_capability",
            "Needs the client's sampling capability; without it, fails with -32021.",
            empty(),
        ),
        tool(
            "test_streaming_elicitation",
            "Streams its answer without sending the client any request.",
            empty(),
        ),
        tool(
            "test_logging_tool",
            "Logs at the level the request's _meta asks for, and not at all if it asks for none.",
            empty(),
        ),
        tool(
            "test_trigger_tool_change",
            "Adds or removes test_dynamic_tool and announces the change.",
            empty(),
        ),
        tool(
            "test_trigger_prompt_change",
            "Adds or removes test_dynamic_prompt and announces the change.",
            empty(),
        ),
        // SEP-2243 (http-custom-header-server-validation): `region` is mirrored in an
        // `Mcp-Param-Region` header, which rmcp checks against the body (via `get_tool`).
        tool(
            "test_custom_header",
            "Echoes a region that clients also send as the Mcp-Param-Region header.",
            json!({
                "type": "object",
                "properties": {
                    "region": {"type": "string", "description": "A region name.", "x-mcp-header": "Region"},
                },
                "required": ["region"],
            }),
        ),
        tool(
            "test_update_watched_resource",
            "Changes test://watched-resource and notifies its subscribers.",
            empty(),
        ),
        // 2026-07-28 multi-round tool results (SEP-2322).
        tool(
            "test_input_required_result_elicitation",
            "Asks for the user's name through an InputRequiredResult, then greets them.",
            empty(),
        ),
        tool(
            "test_input_required_result_sampling",
            "Asks the client's model a question through an InputRequiredResult.",
            empty(),
        ),
        tool(
            "test_input_required_result_list_roots",
            "Asks for the client's roots through an InputRequiredResult.",
            empty(),
        ),
        tool(
            "test_input_required_result_request_state",
            "Asks for a confirmation, carrying sealed requestState to the retry.",
            empty(),
        ),
        tool(
            "test_input_required_result_multiple_inputs",
            "Asks for an elicitation, a sampling and the roots at once.",
            empty(),
        ),
        tool(
            "test_input_required_result_multi_round",
            "Asks two questions in two rounds, the state changing between them.",
            empty(),
        ),
        tool(
            "test_input_required_result_tampered_state",
            "Rejects a retry whose requestState fails its integrity check.",
            empty(),
        ),
        tool(
            "test_input_required_result_capabilities",
            "Asks only for inputs the request's client capabilities allow.",
            empty(),
        ),
    ]
}

fn prompts() -> Vec<Value> {
    let required = |name: &str, description: &str| json!({"name": name, "description": description, "required": true});
    vec![
        json!({"name": "test_simple_prompt", "description": "A prompt without arguments."}),
        json!({
            "name": "test_prompt_with_arguments",
            "description": "A prompt that quotes its two arguments.",
            "arguments": [required("arg1", "First argument."), required("arg2", "Second argument.")],
        }),
        json!({
            "name": "test_prompt_with_embedded_resource",
            "description": "A prompt that embeds the resource it is given.",
            "arguments": [required("resourceUri", "URI of the resource to embed.")],
        }),
        json!({"name": "test_prompt_with_image", "description": "A prompt that shows an image."}),
        json!({
            "name": "test_input_required_result_prompt",
            "description": "Asks for context through an InputRequiredResult, then builds the prompt.",
        }),
    ]
}

fn resources() -> Vec<Value> {
    vec![
        json!({"uri": "test://static-text", "name": "static-text", "description": "A fixed text resource.", "mimeType": "text/plain"}),
        json!({"uri": "test://static-binary", "name": "static-binary", "description": "A fixed PNG image.", "mimeType": "image/png"}),
        json!({"uri": WATCHED_RESOURCE, "name": "watched-resource", "description": "Text that test_update_watched_resource changes; subscribe to hear about it.", "mimeType": "text/plain"}),
    ]
}

fn templates() -> Vec<Value> {
    vec![json!({
        "uriTemplate": TEMPLATE,
        "name": "template-data",
        "description": "JSON data for any id.",
        "mimeType": "application/json",
    })]
}
