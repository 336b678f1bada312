//! Prompts, resources and completions: what `prompts/get`, `resources/read` and
//! `completion/complete` answer (the listings are in `catalog.rs`).

use rmcp::{
    ErrorData as McpError,
    model::{
        ClientCapabilities, CompleteRequestParams, CompleteResult, CompletionInfo, ContentBlock,
        GetPromptRequestParams, GetPromptResponse, GetPromptResult, PromptMessage,
        ReadResourceResult, ResourceContents, Role,
    },
};
use serde_json::{Value, json};

use crate::{
    catalog::{DYNAMIC_PROMPT, WATCHED_RESOURCE},
    mrtr,
    state::Shared,
    tools::{internal, text_contents},
};

pub fn get_prompt(
    shared: &Shared,
    request: GetPromptRequestParams,
    capabilities: &ClientCapabilities,
) -> Result<GetPromptResponse, McpError> {
    let name = request.name.as_str();
    if !shared.has_prompt(name) {
        return Err(McpError::invalid_params(
            format!("unknown prompt: {name}"),
            Some(json!({"name": name})),
        ));
    }
    let argument = |key: &str| {
        request
            .arguments
            .as_ref()
            .and_then(|arguments| arguments.get(key))
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| {
                McpError::invalid_params(
                    format!("argument `{key}` is required"),
                    Some(json!({"argument": key})),
                )
            })
    };
    let user = |content: ContentBlock| PromptMessage::new(Role::User, content);
    let text = |text: String| user(ContentBlock::text(text));
    let messages = match name {
        "test_simple_prompt" => vec![text("This is a simple prompt for testing.".into())],
        "test_prompt_with_arguments" => vec![text(format!(
            "Prompt with arguments: arg1='{}', arg2='{}'",
            argument("arg1")?,
            argument("arg2")?
        ))],
        "test_prompt_with_embedded_resource" => {
            let uri = argument("resourceUri")?;
            vec![
                user(ContentBlock::resource(text_contents(
                    &uri,
                    "text/plain",
                    "Embedded resource content for testing.",
                ))),
                text("Please process the embedded resource above.".into()),
            ]
        }
        "test_prompt_with_image" => vec![
            user(ContentBlock::image(shared.png.clone(), "image/png")),
            text("Please analyze the image above.".into()),
        ],
        mrtr::PROMPT => {
            return match mrtr::round(
                &shared.sealer,
                name,
                capabilities,
                request.input_responses.as_ref(),
                request.request_state.as_deref(),
            )? {
                mrtr::Round::Complete(body) => Ok(GetPromptResult::new(vec![text(body)]).into()),
                mrtr::Round::Ask(input) => Ok(input.into()),
            };
        }
        DYNAMIC_PROMPT => vec![text("The dynamic prompt.".into())],
        _ => return Err(internal(format!("listed prompt {name} has no messages"))),
    };
    let mut result = GetPromptResult::new(messages);
    result.description = Some(format!("The {name} prompt"));
    Ok(result.into())
}

pub fn read_resource(shared: &Shared, uri: &str) -> Result<ReadResourceResult, McpError> {
    let contents = match uri {
        "test://static-text" => text_contents(
            uri,
            "text/plain",
            "This is the content of the static text resource.",
        ),
        "test://static-binary" => ResourceContents::BlobResourceContents {
            uri: uri.to_string(),
            mime_type: Some("image/png".to_string()),
            blob: shared.png.clone(),
            meta: None,
        },
        WATCHED_RESOURCE => text_contents(uri, "text/plain", &shared.watched_text()),
        _ => match template_id(uri) {
            Some(id) => text_contents(
                uri,
                "application/json",
                &json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")})
                    .to_string(),
            ),
            // rmcp turns -32002 into -32602 on 2026-07-28 (SEP-2164); data names the URI.
            None => {
                return Err(McpError::resource_not_found(
                    format!("no resource at {uri}"),
                    Some(json!({"uri": uri})),
                ));
            }
        },
    };
    Ok(ReadResourceResult::new(vec![contents]))
}

/// The `{id}` of `test://template/{id}/data`.
fn template_id(uri: &str) -> Option<&str> {
    let id = uri
        .strip_prefix("test://template/")?
        .strip_suffix("/data")?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

pub fn complete(request: &CompleteRequestParams) -> Result<CompleteResult, McpError> {
    let reference = serde_json::to_value(&request.r#ref)
        .map_err(|error| internal(format!("completion reference: {error}")))?;
    let name = reference
        .get("name")
        .or_else(|| reference.get("uri"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let candidates: &[&str] = match (name, request.argument.name.as_str()) {
        ("test_prompt_with_arguments", "arg1") => &["testValue1", "test-one", "another1"],
        ("test_prompt_with_arguments", "arg2") => &["testValue2", "test-two", "another2"],
        ("test_prompt_with_embedded_resource", "resourceUri") => {
            &["test://static-text", "test://example-resource"]
        }
        (crate::catalog::TEMPLATE, "id") => &["123", "456", "789"],
        _ => &[],
    };
    let typed = request.argument.value.to_lowercase();
    let values: Vec<String> = candidates
        .iter()
        .filter(|candidate| candidate.to_lowercase().starts_with(&typed))
        .map(|candidate| candidate.to_string())
        .collect();
    // The constructor sets `resultType: "complete"`, which 2026-07-28 requires (rmcp strips
    // it for older peers).
    CompletionInfo::with_all_values(values)
        .map(CompleteResult::new)
        .map_err(|error| internal(format!("completion result: {error}")))
}
