//! The fixture's prompts, resources and resource templates (`--prompts`, `--resources`,
//! `--templates`), and what it answers for them.
//!
//! Every prompt takes a required `name` argument and greets it; every resource reads as
//! `contents of <uri>`; completions offer `alice`, `bob`, `carol` for a prompt's `name` and
//! `1`, `2`, `3` for a template's variables, filtered by the typed prefix.

use rmcp::{
    ErrorData as McpError,
    model::{
        CompleteRequestParams, CompleteResult, CompletionInfo, GetPromptResult, Prompt,
        PromptArgument, PromptMessage, ReadResourceResult, Reference, Resource, ResourceContents,
        ResourceTemplate, Role,
    },
};

use crate::cli::Behaviour;

pub fn prompts(settings: &Behaviour) -> Vec<Prompt> {
    settings
        .prompts
        .iter()
        .flatten()
        .map(|name| {
            Prompt::new(
                name.clone(),
                Some(format!("The fixture's {name} prompt.")),
                Some(vec![
                    PromptArgument::new("name")
                        .with_description("Who to greet")
                        .with_required(true),
                ]),
            )
        })
        .collect()
}

pub fn resources(settings: &Behaviour) -> Vec<Resource> {
    settings
        .resources
        .iter()
        .flatten()
        .map(|uri| Resource::new(uri.clone(), uri.clone()))
        .collect()
}

pub fn templates(settings: &Behaviour) -> Vec<ResourceTemplate> {
    settings
        .templates
        .iter()
        .flatten()
        .map(|template| ResourceTemplate::new(template.clone(), template.clone()))
        .collect()
}

pub fn get_prompt(
    settings: &Behaviour,
    name: &str,
    arguments: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<GetPromptResult, McpError> {
    if !settings.prompts.iter().flatten().any(|p| p == name) {
        return Err(McpError::invalid_params(
            format!("unknown prompt: {name}"),
            None,
        ));
    }
    let who = arguments
        .and_then(|args| args.get("name"))
        .and_then(|v| v.as_str())
        .ok_or_else(|| McpError::invalid_params(format!("{name}: `name` is required"), None))?;
    Ok(GetPromptResult::new(vec![PromptMessage::new_text(
        Role::User,
        format!("{name}: hello, {who}!"),
    )])
    .with_description(format!("The fixture's {name} prompt.")))
}

pub fn read(settings: &Behaviour, uri: &str) -> Result<ReadResourceResult, McpError> {
    let listed = settings.resources.iter().flatten().any(|r| r == uri);
    let templated = settings.templates.iter().flatten().any(|t| {
        t.split('{')
            .next()
            .is_some_and(|prefix| uri.starts_with(prefix))
    });
    if !listed && !templated {
        return Err(McpError::resource_not_found(
            format!("no resource {uri}"),
            None,
        ));
    }
    Ok(ReadResourceResult::new(vec![ResourceContents::text(
        format!("contents of {uri}"),
        uri,
    )]))
}

pub fn complete(request: &CompleteRequestParams) -> Result<CompleteResult, McpError> {
    let choices: &[&str] = match &request.r#ref {
        Reference::Prompt(_) if request.argument.name == "name" => &["alice", "bob", "carol"],
        Reference::Resource(_) => &["1", "2", "3"],
        _ => &[],
    };
    let values = choices
        .iter()
        .filter(|c| c.starts_with(request.argument.value.as_str()))
        .map(|c| c.to_string())
        .collect();
    let info =
        CompletionInfo::with_all_values(values).map_err(|e| McpError::internal_error(e, None))?;
    Ok(CompleteResult::new(info))
}
