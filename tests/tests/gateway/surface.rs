//! The whole MCP surface through `tether serve`, for clients of both generations: prompts,
//! resources, templates, completions, subscriptions, progress, cancellation, logging and
//! unserved methods, with two real upstreams whose offers partly collide.

#![allow(deprecated)] // logging and resources/subscribe: legacy-only, and served

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, ClientRequest, CustomRequest,
    GetPromptRequestParams, GetPromptResponse, LoggingLevel, LoggingMessageNotificationParam,
    ProgressNotificationParam, ProgressToken, ProtocolVersion, ReadResourceRequestParams,
    ResourceContents, ResourceUpdatedNotificationParam, ServerNotification, ServerResult,
    SetLevelRequestParams, SubscribeRequestParams, SubscriptionFilter,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, Peer, RoleClient, ServiceExt};
use serde_json::json;

use super::*;

/// A client that records every notification it gets.
#[derive(Clone, Default)]
struct Watcher {
    heard: Arc<Mutex<Heard>>,
}

#[derive(Default, Debug)]
struct Heard {
    prompt_lists: usize,
    resource_lists: usize,
    updated: Vec<String>,
    logs: Vec<LoggingMessageNotificationParam>,
    progress: Vec<ProgressNotificationParam>,
}

impl Watcher {
    fn heard<T>(&self, read: impl FnOnce(&Heard) -> T) -> T {
        read(&self.heard.lock().unwrap())
    }
}

impl ClientHandler for Watcher {
    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.heard.lock().unwrap().prompt_lists += 1;
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.heard.lock().unwrap().resource_lists += 1;
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.heard.lock().unwrap().updated.push(params.uri);
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.heard.lock().unwrap().logs.push(params);
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.heard.lock().unwrap().progress.push(params);
    }
}

/// Two fixture upstreams over stdio: `docs` and `notes` both offer a `greet` prompt (distinct
/// once namespaced) and both list `shared://x` (a collision: refused while both are visible).
struct TwoUpstreams {
    dir: tempfile::TempDir,
    docs: StateDir,
    notes: StateDir,
    config: PathBuf,
}

fn two_upstreams() -> TwoUpstreams {
    let dir = tempfile::tempdir().unwrap();
    let docs = StateDir(dir.path().join("docs"));
    let notes = StateDir(dir.path().join("notes"));
    std::fs::create_dir_all(&docs.0).unwrap();
    std::fs::create_dir_all(&notes.0).unwrap();
    let server = |state: &StateDir, offer: &[&str]| {
        let mut args = vec!["--transport", "stdio", "--state-dir", state.path_str()];
        args.extend_from_slice(offer);
        json!({"command": FIXTURE, "args": args})
    };
    let config = json!({"mcpServers": {
        "docs": server(&docs, &[
            "--prompts", "greet,summarize",
            "--resources", "docs://readme,shared://x",
            "--templates", "docs://pages/{id}",
        ]),
        "notes": server(&notes, &["--prompts", "greet", "--resources", "notes://today,shared://x"]),
    }});
    let path = dir.path().join("servers.json");
    std::fs::write(&path, config.to_string()).unwrap();
    TwoUpstreams {
        dir,
        docs,
        notes,
        config: path,
    }
}

async fn prompt_names(peer: &Peer<RoleClient>) -> BTreeSet<String> {
    peer.list_all_prompts()
        .await
        .map(|prompts| prompts.into_iter().map(|p| p.name).collect())
        .unwrap_or_default()
}

async fn resource_uris(peer: &Peer<RoleClient>) -> BTreeSet<String> {
    peer.list_all_resources()
        .await
        .map(|resources| resources.into_iter().map(|r| r.uri).collect())
        .unwrap_or_default()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

async fn read_text(peer: &Peer<RoleClient>, uri: &str) -> Result<String, ServiceError> {
    let result = peer
        .read_resource(ReadResourceRequestParams::new(uri))
        .await?;
    Ok(result
        .contents
        .iter()
        .map(|c| match c {
            ResourceContents::TextResourceContents { text, .. } => text.clone(),
            other => format!("{other:?}"),
        })
        .collect())
}

fn error_message(error: ServiceError) -> String {
    match error {
        ServiceError::McpError(error) => format!("{} {}", error.code.0, error.message),
        other => other.to_string(),
    }
}

/// What every client gets, whatever its generation or transport: namespaced prompts, routed
/// resources and templates, completions, clear errors, and no phantoms when a server dies.
async fn exercise_the_surface(peer: &Peer<RoleClient>, upstreams: &TwoUpstreams) {
    let all_prompts = set(&["docs__greet", "docs__summarize", "notes__greet"]);
    wait_for(
        "every prompt is listed",
        || prompt_names(peer),
        |p| *p == all_prompts,
    )
    .await;
    let prompt = peer
        .get_prompt(
            GetPromptRequestParams::new("notes__greet")
                .with_arguments(args(json!({"name": "ada"})).unwrap()),
        )
        .await
        .expect("prompts/get is routed to notes");
    assert!(
        format!("{:?}", prompt.messages[0].content).contains("greet: hello, ada!"),
        "{prompt:?}"
    );
    let unknown = peer
        .get_prompt(GetPromptRequestParams::new("nobody__greet"))
        .await
        .unwrap_err();
    assert!(error_message(unknown).contains("unknown prompt"));
    let missing_argument = peer
        .get_prompt(GetPromptRequestParams::new("docs__greet"))
        .await
        .unwrap_err();
    assert!(
        error_message(missing_argument).contains("server \"docs\""),
        "the server's own error is attributed to it"
    );

    // shared://x is listed by both servers: refused, not guessed.
    let uris = resource_uris(peer).await;
    assert_eq!(uris, set(&["docs://readme", "notes://today"]));
    assert_eq!(
        read_text(peer, "notes://today").await.unwrap(),
        "contents of notes://today"
    );
    assert_eq!(
        read_text(peer, "docs://pages/7").await.unwrap(),
        "contents of docs://pages/7"
    );
    let contested = error_message(read_text(peer, "shared://x").await.unwrap_err());
    assert!(contested.contains("several servers"), "{contested}");
    let unknown = error_message(read_text(peer, "nowhere://x").await.unwrap_err());
    assert!(unknown.contains("no visible server"), "{unknown}");
    let templates = peer.list_all_resource_templates().await.unwrap();
    assert_eq!(templates.len(), 1);
    assert_eq!(templates[0].uri_template, "docs://pages/{id}");

    let names = peer
        .complete_prompt_simple("docs__greet", "name", "b")
        .await
        .expect("completion of a prompt argument");
    assert_eq!(names, ["bob"]);
    let ids = peer
        .complete_resource_simple("docs://pages/{id}", "id", "")
        .await
        .expect("completion of a template variable");
    assert_eq!(ids, ["1", "2", "3"]);

    let unserved = peer
        .send_request(ClientRequest::CustomRequest(CustomRequest::new(
            "tether/not-a-method",
            None,
        )))
        .await
        .unwrap_err();
    let unserved = error_message(unserved);
    assert!(
        unserved.contains("-32601") && unserved.contains("tether/not-a-method"),
        "{unserved}"
    );

    // docs dies for good: its prompts and resources go with its tools, and shared://x is
    // no longer contested.
    upstreams.docs.control(json!({"crash_at_startup": 3}));
    kill(upstreams.docs.pid().unwrap(), 9);
    wait_for(
        "docs' prompts are withdrawn",
        || prompt_names(peer),
        |p| *p == set(&["notes__greet"]),
    )
    .await;
    assert_eq!(
        resource_uris(peer).await,
        set(&["notes://today", "shared://x"])
    );
    assert_eq!(
        read_text(peer, "shared://x").await.unwrap(),
        "contents of shared://x"
    );
    assert!(peer.list_all_resource_templates().await.unwrap().is_empty());
    let gone = error_message(
        peer.get_prompt(
            GetPromptRequestParams::new("docs__greet")
                .with_arguments(args(json!({"name": "x"})).unwrap()),
        )
        .await
        .unwrap_err(),
    );
    assert!(gone.contains("unknown prompt"), "{gone}");

    upstreams.docs.control(json!({"crash_at_startup": null}));
    wait_for(
        "docs' prompts are back",
        || prompt_names(peer),
        |p| *p == all_prompts,
    )
    .await;
    assert_eq!(
        read_text(peer, "docs://readme").await.unwrap(),
        "contents of docs://readme"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_client_on_stdio_gets_prompts_resources_and_completions() {
    let upstreams = two_upstreams();
    let mut tether = serve(
        upstreams.dir.path(),
        &upstreams.config,
        &[],
        Some(&upstreams.dir.path().join("serve.log")),
    );
    let io = (tether.stdout.take().unwrap(), tether.stdin.take().unwrap());
    let watcher = Watcher::default();
    let client = watcher.clone().serve(io).await.expect("MCP over stdio");
    exercise_the_surface(client.peer(), &upstreams).await;
    // The death and the return were announced for both lists.
    wait_until("prompt and resource list changes were announced", || {
        watcher.heard(|h| h.prompt_lists >= 2 && h.resource_lists >= 2)
    })
    .await;
    assert!(terminate(tether).await.success());
}

/// What a server tells agents about using it (`instructions`) reaches them as it gave it, at
/// `initialize` and at `server/discover`, although the agent starts before the server is up;
/// several servers' each under the server's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_instructions_reach_agents_of_both_generations() {
    let dir = tempfile::tempdir().unwrap();
    let server = |name: &str, instructions: &str| {
        let state = dir.path().join(name);
        std::fs::create_dir_all(&state).unwrap();
        json!({"command": FIXTURE, "args": ["--transport", "stdio",
            "--state-dir", state, "--instructions", instructions]})
    };
    let docs = "Call `greet` first.\nThen summarize.";
    let one = dir.path().join("one.json");
    let config = json!({"mcpServers": {"docs": server("docs", docs)}});
    std::fs::write(&one, config.to_string()).unwrap();
    let two = dir.path().join("two.json");
    let config = json!({"mcpServers": {
        "docs": server("docs", docs),
        "notes": server("notes", "Notes are kept a day."),
    }});
    std::fs::write(&two, config.to_string()).unwrap();

    let given = |client: &RunningService<RoleClient, Watcher>| {
        let info = client.peer_info().expect("the server's info");
        info.instructions.clone()
    };
    let several = format!("## docs\n\n{docs}\n\n## notes\n\nNotes are kept a day.");
    for (config, expected) in [(&one, docs.to_string()), (&two, several)] {
        let mut tether = serve(dir.path(), config, &[], Some(&dir.path().join("serve.log")));
        let io = (tether.stdout.take().unwrap(), tether.stdin.take().unwrap());
        let client = Watcher::default().serve(io).await.expect("MCP over stdio");
        assert_eq!(given(&client).as_deref(), Some(expected.as_str()));
        drop(client);
        assert!(terminate(tether).await.success());

        let (tether, url) = serve_http(dir.path(), config).await;
        let client = modern_http_client(&url, Watcher::default()).await;
        assert_eq!(given(&client).as_deref(), Some(expected.as_str()));
        drop(client);
        assert!(terminate(tether).await.success());
    }
}

async fn modern_http_client(url: &str, watcher: Watcher) -> RunningService<RoleClient, Watcher> {
    watcher
        .serve_with_lifecycle(
            StreamableHttpClientTransport::from_uri(url.to_string()),
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .expect("a 2026-07-28 session")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_07_28_client_gets_prompts_resources_and_list_changes_on_its_stream() {
    let upstreams = two_upstreams();
    let (tether, url) = serve_http(upstreams.dir.path(), &upstreams.config).await;
    let client = modern_http_client(&url, Watcher::default()).await;
    let peer = client.peer();
    wait_for(
        "every prompt is listed",
        || prompt_names(peer),
        |p| p.len() == 3,
    )
    .await;
    let mut stream = peer
        .listen(
            SubscriptionFilter::builder()
                .prompts_list_changed()
                .resources_list_changed()
                .resource_subscriptions(["docs://readme".to_string()])
                .build(),
        )
        .await
        .expect("subscriptions/listen");
    let accepted = stream.acknowledged().clone();
    assert_eq!(accepted.prompts_list_changed, Some(true));
    assert_eq!(
        accepted.resource_subscriptions,
        Some(vec!["docs://readme".to_string()])
    );
    // The stream's resource subscription reached the server that offers the URI.
    wait_until("docs was subscribed to docs://readme", || {
        upstreams
            .docs
            .subscriptions()
            .contains(&"subscribe docs://readme".to_string())
    })
    .await;
    upstreams
        .docs
        .control(json!({"updated": ["docs://readme"]}));
    let mut heard = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !heard
        .iter()
        .any(|n| matches!(n, ServerNotification::ResourceUpdatedNotification(u) if u.params.uri == "docs://readme"))
    {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("the update arrives in time")
            .expect("the stream stays open")
            .expect("a notification");
        heard.push(next);
    }
    exercise_the_surface(peer, &upstreams).await;
    // The death (and return) of docs reached the stream as list changes.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut kinds = BTreeSet::new();
    while !(kinds.contains("prompts") && kinds.contains("resources")) {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("list changes arrive in time")
            .expect("the stream stays open")
            .expect("a notification");
        match next {
            ServerNotification::PromptListChangedNotification(_) => kinds.insert("prompts"),
            ServerNotification::ResourceListChangedNotification(_) => kinds.insert("resources"),
            _ => false,
        };
    }
    // Closing the stream, which alone wanted docs://readme, unsubscribes docs from it.
    drop(stream);
    wait_until("docs was unsubscribed from docs://readme", || {
        upstreams
            .docs
            .subscriptions()
            .contains(&"unsubscribe docs://readme".to_string())
    })
    .await;
    assert!(terminate(tether).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_client_gets_resource_updates_and_log_messages_it_asked_for() {
    let upstreams = two_upstreams();
    let (tether, url) = serve_http(upstreams.dir.path(), &upstreams.config).await;
    let watcher = Watcher::default();
    let client = watcher
        .clone()
        .serve(StreamableHttpClientTransport::from_uri(url.clone()))
        .await
        .expect("MCP over HTTP");
    let peer = client.peer();
    wait_for(
        "resources are listed",
        || resource_uris(peer),
        |r| r.len() == 2,
    )
    .await;
    peer.subscribe(SubscribeRequestParams::new("notes://today"))
        .await
        .expect("resources/subscribe");
    assert!(
        upstreams
            .notes
            .subscriptions()
            .contains(&"subscribe notes://today".to_string()),
        "the subscription went to the server that lists the URI"
    );
    peer.set_level(SetLevelRequestParams::new(LoggingLevel::Warning))
        .await
        .expect("logging/setLevel");
    upstreams.notes.control(json!({
        "updated": ["notes://today"],
        "logs": ["disk almost full"],
    }));
    wait_until("the update and the log message arrived", || {
        watcher.heard(|h| h.updated == ["notes://today"] && !h.logs.is_empty())
    })
    .await;
    let log = watcher.heard(|h| h.logs[0].clone());
    assert_eq!(
        log.logger.as_deref(),
        Some("notes"),
        "marked with its server"
    );
    assert_eq!(log.data, json!("disk almost full"));
    // The level reached the servers that offer logging before the client got its answer,
    // as it would without Tether.
    assert_eq!(upstreams.notes.log_levels(), ["setLevel warning"]);
    // A more verbose level: the server sends what it would send this client on its own.
    peer.set_level(SetLevelRequestParams::new(LoggingLevel::Debug))
        .await
        .expect("logging/setLevel");
    assert_eq!(
        upstreams.notes.log_levels().last().unwrap(),
        "setLevel debug"
    );
    upstreams.notes.control(json!({
        "updated": ["notes://today"],
        "logs": ["disk almost full"],
        "debug_logs": ["verbose detail"],
    }));
    wait_until("the debug message arrived", || {
        watcher.heard(|h| h.logs.iter().any(|l| l.data == json!("verbose detail")))
    })
    .await;
    // After the server restarts, the subscription is renewed on the new session, even when
    // the server comes back without tools (no tool list changes then, only its resources).
    upstreams.notes.control(json!({
        "tools": [],
        "updated": ["notes://today"],
        "logs": ["disk almost full"],
        "debug_logs": ["verbose detail"],
    }));
    let first_pid = upstreams.notes.pid().unwrap();
    kill(first_pid, 9);
    wait_until("notes was subscribed again after its restart", || {
        upstreams.notes.pid() != Some(first_pid)
            && upstreams
                .notes
                .subscriptions()
                .iter()
                .filter(|l| *l == "subscribe notes://today")
                .count()
                >= 2
    })
    .await;
    // Its new session is told the level again.
    wait_until("notes was told the level again after its restart", || {
        let levels = upstreams.notes.log_levels();
        levels.iter().filter(|l| *l == "setLevel debug").count() >= 2
    })
    .await;
    // A server without tools still shows its resources while it is up.
    wait_for(
        "the tool-less notes lists its resources",
        || resource_uris(peer),
        |uris| uris.contains("notes://today"),
    )
    .await;

    // A second client wants the same updates; the first leaves without unsubscribing. The
    // second still hears them, and when it leaves too, notes is unsubscribed, as it would be
    // were the clients its own (their sessions would end).
    let second_watcher = Watcher::default();
    let second = second_watcher
        .clone()
        .serve(StreamableHttpClientTransport::from_uri(url))
        .await
        .expect("a second client");
    second
        .peer()
        .subscribe(SubscribeRequestParams::new("notes://today"))
        .await
        .expect("resources/subscribe");
    second
        .peer()
        .set_level(SetLevelRequestParams::new(LoggingLevel::Error))
        .await
        .expect("logging/setLevel");
    client.cancel().await.expect("the first client leaves");
    // The most verbose client left: the servers are told the next one's level.
    wait_until("notes was told the remaining client's level", || {
        upstreams.notes.log_levels().last().map(String::as_str) == Some("setLevel error")
    })
    .await;
    let unsubscribed = || {
        upstreams
            .notes
            .subscriptions()
            .contains(&"unsubscribe notes://today".to_string())
    };
    upstreams.notes.control(json!({
        "tools": [],
        "updated": ["notes://today", "notes://today"],
        "logs": ["disk almost full"],
        "debug_logs": ["verbose detail"],
    }));
    wait_until("the second client heard the update", || {
        second_watcher.heard(|h| h.updated.iter().any(|uri| uri == "notes://today"))
    })
    .await;
    assert!(
        !unsubscribed(),
        "notes was unsubscribed while a client wanted the URI"
    );
    second.cancel().await.expect("the second client leaves");
    wait_until(
        "notes was unsubscribed once nobody wanted the URI",
        unsubscribed,
    )
    .await;
    assert!(terminate(tether).await.success());
}

/// Sends a tool call and returns its handle (the client's progress token is in it).
async fn send_call(
    peer: &Peer<RoleClient>,
    tool: &str,
    arguments: serde_json::Value,
) -> rmcp::service::RequestHandle<RoleClient> {
    let params =
        CallToolRequestParams::new(tool.to_string()).with_arguments(args(arguments).unwrap());
    peer.send_request_with_option(
        ClientRequest::CallToolRequest(CallToolRequest::new(params)),
        PeerRequestOptions::no_options(),
    )
    .await
    .expect("the call is sent")
}

async fn progress_cancellation_and_death(
    peer: &Peer<RoleClient>,
    watcher: &Watcher,
    upstreams: &TwoUpstreams,
) {
    wait_for(
        "notes' tools are listed",
        || async {
            let tools = peer.list_all_tools().await.unwrap_or_default();
            tools.iter().any(|tool| tool.name == "notes__slow")
        },
        |listed| *listed,
    )
    .await;

    // Progress arrives with the client's own token, in order, and the answer after it.
    let handle = send_call(peer, "notes__slow", json!({"ms": 700})).await;
    let token: ProgressToken = handle.progress_token.clone();
    let answer = handle.await_response().await.expect("slow answers");
    assert!(
        matches!(answer, ServerResult::CallToolResult(_)),
        "{answer:?}"
    );
    let progress = watcher.heard(|h| h.progress.clone());
    assert!(progress.len() >= 3, "progress passed on: {progress:?}");
    assert!(progress.iter().all(|p| p.progress_token == token));
    assert!(progress.windows(2).all(|w| w[0].progress < w[1].progress));

    // A cancelled call: the server hears of it and keeps running; nothing counts as a failure.
    let pid = upstreams.notes.pid().unwrap();
    let handle = send_call(peer, "notes__slow", json!({"ms": 20000})).await;
    wait_until("the slow call reached notes", || {
        upstreams.notes.calls_of("slow") == 2
    })
    .await;
    handle.cancel(Some("changed my mind".into())).await.unwrap();
    wait_until("notes heard of the cancellation", || {
        upstreams.notes.cancelled() == 1
    })
    .await;
    assert_eq!(upstreams.notes.pid(), Some(pid), "the server keeps running");
    let after = send_call(peer, "notes__echo", json!({"text": "still here"}))
        .await
        .await_response()
        .await
        .expect("the next call is served");
    assert!(format!("{after:?}").contains("still here"));

    // The server dies in the middle of a progress stream: the call ends with words for the
    // model, and the stream stops.
    let handle = send_call(peer, "notes__slow", json!({"ms": 20000})).await;
    let seen = watcher.heard(|h| h.progress.len());
    wait_until("progress of the doomed call arrives", || {
        watcher.heard(|h| h.progress.len()) > seen
    })
    .await;
    kill(upstreams.notes.pid().unwrap(), 9);
    let answer = tokio::time::timeout(PATIENCE, handle.await_response())
        .await
        .expect("the call ends in time")
        .expect("an answer");
    let ServerResult::CallToolResult(result) = answer else {
        panic!("{answer:?}");
    };
    assert_eq!(result.is_error, Some(true));
    assert!(text(&result).contains("uncertain"), "{}", text(&result));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_and_cancellation_reach_the_right_ends_on_both_generations() {
    let upstreams = two_upstreams();
    let gateway = start_http(serve_command(
        upstreams.dir.path(),
        &upstreams.config,
        &["--http", "127.0.0.1:0"],
    ))
    .await;

    let legacy = Watcher::default();
    let client = legacy
        .clone()
        .serve(StreamableHttpClientTransport::from_uri(gateway.url.clone()))
        .await
        .expect("a legacy session");
    progress_cancellation_and_death(client.peer(), &legacy, &upstreams).await;

    // A 2026-07-28 client: its cancellation closes the request's stream.
    wait_for(
        "notes is back",
        || async {
            client
                .peer()
                .list_all_tools()
                .await
                .map(|t| t.len())
                .unwrap_or(0)
        },
        |n| *n > 0,
    )
    .await;
    std::fs::remove_file(upstreams.notes.0.join("cancelled")).ok();
    std::fs::remove_file(upstreams.notes.0.join("calls.log")).ok();
    let modern = Watcher::default();
    let client = modern_http_client(&gateway.url, modern.clone()).await;
    progress_cancellation_and_death(client.peer(), &modern, &upstreams).await;
    assert!(terminate(gateway.tether).await.success());
}

/// The same on `tether serve`'s own stdio, where a client's tool calls are served off rmcp's
/// service loop (`gateway/direct.rs`): progress before the answer, a cancellation that reaches
/// the server, a death in the middle of a call; and an agent that leaves during a call ends it
/// (the gateway exits at once, not after its 30 s drain).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_and_cancellation_reach_the_right_ends_on_stdio() {
    let upstreams = two_upstreams();
    let mut tether = serve_command(upstreams.dir.path(), &upstreams.config, &[])
        .stderr(Stdio::null())
        .spawn()
        .expect("tether serve starts");
    let io = (tether.stdout.take().unwrap(), tether.stdin.take().unwrap());
    let watcher = Watcher::default();
    let client = watcher.clone().serve(io).await.expect("MCP over stdio");
    progress_cancellation_and_death(client.peer(), &watcher, &upstreams).await;

    wait_for(
        "notes is back",
        || async {
            let tools = client.peer().list_all_tools().await.unwrap_or_default();
            tools.iter().any(|tool| tool.name == "notes__slow")
        },
        |back| *back,
    )
    .await;
    let slow_calls = upstreams.notes.calls_of("slow");
    let _left_running = send_call(client.peer(), "notes__slow", json!({"ms": 60000})).await;
    wait_until("the last slow call reached notes", || {
        upstreams.notes.calls_of("slow") > slow_calls
    })
    .await;
    let left = std::time::Instant::now();
    agent_leaves_and_gateway_exits(client, &mut tether).await;
    assert!(
        left.elapsed() < Duration::from_secs(15),
        "the call kept the gateway for {:?}: it was not cancelled with the session",
        left.elapsed()
    );
}

/// Upstreams of protocol 2026-07-28 only (no `initialize`, no `ping`): a stdio child and a
/// Streamable HTTP server, behind one gateway, for a legacy client: tools, prompts and resource
/// updates, with list changes heard on the upstream's `subscriptions/listen` stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_of_2026_07_28_only_are_detected_and_fully_served() {
    let dir = tempfile::tempdir().unwrap();
    let local = StateDir(dir.path().join("local"));
    let web = StateDir(dir.path().join("web"));
    std::fs::create_dir_all(&local.0).unwrap();
    std::fs::create_dir_all(&web.0).unwrap();
    let web_server = HttpFixture::start(
        "http",
        &web,
        "127.0.0.1:0",
        &["--modern-only", "--prompts", "hello"],
    )
    .await;
    let config = json!({"mcpServers": {
        "local": {"command": FIXTURE, "args": [
            "--transport", "stdio", "--state-dir", local.path_str(), "--modern-only",
                        "--prompts", "greet,ask", "--resources", "local://a",
        ]},
        "web": {"url": format!("http://{}/mcp", web_server.addr), "type": "http"},
    }});
    let config_path = dir.path().join("servers.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let (tether, url) = serve_http(dir.path(), &config_path).await;
    let watcher = Watcher::default();
    let client = watcher
        .clone()
        .serve(StreamableHttpClientTransport::from_uri(url.clone()))
        .await
        .expect("a legacy session");
    let peer = client.peer();
    wait_for(
        "both modern upstreams' prompts are listed",
        || prompt_names(peer),
        |p| *p == set(&["local__ask", "local__greet", "web__hello"]),
    )
    .await;
    for tool in ["local__echo", "web__echo"] {
        let result = peer
            .call_tool(
                CallToolRequestParams::new(tool)
                    .with_arguments(args(json!({"text": tool})).unwrap()),
            )
            .await
            .expect("the call is answered");
        assert_eq!(text(&result), tool);
    }

    // The upstream's tool list changes: heard on its listen stream, not by polling.
    local.control(json!({"tools": ["echo"]}));
    wait_for(
        "local's new tool list is served",
        || async {
            peer.list_all_tools()
                .await
                .map(|tools| {
                    tools
                        .into_iter()
                        .filter(|t| t.name.starts_with("local__"))
                        .map(|t| t.name.to_string())
                        .collect::<BTreeSet<_>>()
                })
                .unwrap_or_default()
        },
        |tools| *tools == set(&["local__echo"]),
    )
    .await;

    // A legacy client's subscription becomes the modern upstream's listen filter.
    peer.subscribe(SubscribeRequestParams::new("local://a"))
        .await
        .expect("resources/subscribe");
    wait_until("local listens for local://a", || {
        local
            .subscriptions()
            .contains(&"subscribe local://a".to_string())
    })
    .await;
    local.control(json!({"tools": ["echo"], "updated": ["local://a"]}));
    wait_until("the update reached the client", || {
        watcher.heard(|h| h.updated == ["local://a"])
    })
    .await;

    // A server's request for input (InputRequiredResult) reaches a client that can answer it,
    // and the answer reaches the server; a legacy client gets words instead.
    local.control(json!({"tools": ["echo", "confirm"]}));
    let modern = modern_http_client(&url, Watcher::default()).await;
    let asked = wait_for(
        "local__confirm is served",
        || async {
            modern
                .peer()
                .call_tool_once(CallToolRequestParams::new("local__confirm"))
                .await
                .map_err(error_message)
        },
        |answer| matches!(answer, Ok(CallToolResponse::InputRequired(_))),
    )
    .await;
    let Ok(CallToolResponse::InputRequired(asked)) = asked else {
        unreachable!()
    };
    assert_eq!(asked.request_state.as_deref(), Some("state-1"));
    assert!(
        asked
            .input_requests
            .as_ref()
            .unwrap()
            .contains_key("confirm")
    );
    let mut retry = CallToolRequestParams::new("local__confirm");
    retry.input_responses = Some(
        [(
            "confirm".to_string(),
            json!({"action": "accept", "content": {"ok": true}}),
        )]
        .into(),
    );
    retry.request_state = asked.request_state.clone();
    let answered = modern
        .peer()
        .call_tool(retry)
        .await
        .expect("the retry is answered");
    assert!(
        text(&answered).starts_with("confirmed {") && text(&answered).ends_with("with state-1"),
        "{}",
        text(&answered)
    );
    // A legacy client that declared no elicitation gets an error naming what it lacks.
    let legacy = error_message(
        peer.call_tool(CallToolRequestParams::new("local__confirm"))
            .await
            .unwrap_err(),
    );
    assert!(
        legacy.contains("needs elicitation") && legacy.contains("did not declare"),
        "{legacy}"
    );
    // The same for a prompt.
    let Ok(GetPromptResponse::InputRequired(asked)) = modern
        .peer()
        .get_prompt_once(GetPromptRequestParams::new("local__ask"))
        .await
    else {
        panic!("prompts/get passes the request for input on");
    };
    let mut retry = GetPromptRequestParams::new("local__ask");
    retry.input_responses = Some([("confirm".to_string(), json!({"action": "decline"}))].into());
    retry.request_state = asked.request_state;
    let prompt = modern
        .peer()
        .get_prompt(retry)
        .await
        .expect("the retry is answered");
    assert!(format!("{prompt:?}").contains("with state-1"), "{prompt:?}");
    let refused = error_message(
        peer.get_prompt(GetPromptRequestParams::new("local__ask"))
            .await
            .unwrap_err(),
    );
    assert!(refused.contains("needs elicitation"), "{refused}");

    assert!(terminate(tether).await.success());
    web_server.kill().await;
}

/// Opening sessions directly: the generation is detected and remembered, a modern session's
/// keepalive works without `ping`, and a pinned generation the server does not speak fails
/// with a fault that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generation_is_detected_remembered_and_can_be_pinned() {
    use tether::config::ProtocolChoice;
    use tether::transport::generation::Generation;
    use tether::upstream::{ListChanges, Remembered, Session};

    let host = Host::fast();
    let open = |spec: tether::config::ServerSpec, remembered: &mut Remembered| {
        let log_dir = host.dir.path().join("logs");
        let mut remembered_copy = *remembered;
        async move {
            let result = Session::open(
                &spec,
                &mut remembered_copy,
                Arc::new(ListChanges::default()),
                tokio::sync::broadcast::channel(8).0,
                &log_dir,
                None,
            )
            .await;
            (result, remembered_copy)
        }
    };

    let modern_state = host.state_dir("modern");
    let modern = stdio_fixture("modern", &modern_state, &["--modern-only"]);
    let mut remembered = Remembered::default();
    let (session, after) = open(modern.clone(), &mut remembered).await;
    let session = session.expect("a modern-only server is served");
    assert_eq!(session.generation(), Generation::Modern);
    assert_eq!(after.generation, Some(Generation::Modern));
    session
        .keepalive(&modern.timeouts)
        .await
        .expect("keepalive without ping");
    session.close(modern.timeouts.stop_grace).await;

    let legacy_state = host.state_dir("legacy");
    let legacy = stdio_fixture("legacy", &legacy_state, &[]);
    let (session, after) = open(legacy.clone(), &mut Remembered::default()).await;
    let session = session.expect("a legacy server is served");
    assert_eq!(session.generation(), Generation::Legacy);
    assert_eq!(after.generation, Some(Generation::Legacy));
    session.keepalive(&legacy.timeouts).await.expect("ping");
    session.close(legacy.timeouts.stop_grace).await;

    let mut pinned = legacy.clone();
    pinned.protocol = ProtocolChoice::Modern;
    let (refused, _) = open(pinned, &mut Remembered::default()).await;
    let fault = refused
        .err()
        .expect("a legacy server cannot speak 2026-07-28")
        .to_string();
    assert!(fault.contains("\"2026-07-28\" is configured"), "{fault}");
    let mut pinned = modern.clone();
    pinned.protocol = ProtocolChoice::Legacy;
    let (refused, _) = open(pinned, &mut Remembered::default()).await;
    let fault = refused
        .err()
        .expect("a 2026-07-28-only server refuses initialize")
        .to_string();
    assert!(fault.contains("\"2025-11-25\" is configured"), "{fault}");
}

/// A 2026-07-28 client asks for log messages per request (`_meta` `logLevel`): those its call's
/// server sends during the call reach it on the call's stream, at or above its level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_07_28_client_gets_the_log_messages_of_its_call_at_its_level() {
    let upstreams = two_upstreams();
    let (tether, url) = serve_http(upstreams.dir.path(), &upstreams.config).await;
    let watcher = Watcher::default();
    let client = modern_http_client(&url, watcher.clone()).await;
    let peer = client.peer();
    wait_for(
        "notes' tools are listed",
        || async {
            let tools = peer.list_all_tools().await.unwrap_or_default();
            tools.iter().any(|tool| tool.name == "notes__slow")
        },
        |listed| *listed,
    )
    .await;
    let mut sent = Vec::new();
    for (level, message) in [
        (LoggingLevel::Error, "below the level"),
        (LoggingLevel::Warning, "at the level"),
    ] {
        let mut meta = rmcp::model::RequestMetaObject::new();
        meta.set_log_level(level);
        let params = CallToolRequestParams::new("notes__slow")
            .with_arguments(args(json!({"ms": 1500})).unwrap());
        let handle = peer
            .send_request_with_option(
                ClientRequest::CallToolRequest(CallToolRequest::new(params)),
                {
                    let mut options = PeerRequestOptions::no_options();
                    options.meta = Some(meta);
                    options
                },
            )
            .await
            .unwrap();
        let calls = upstreams.notes.calls_of("slow");
        wait_until("the call reached notes", || {
            upstreams.notes.calls_of("slow") > calls
        })
        .await;
        sent.push(message);
        upstreams.notes.control(json!({"logs": sent}));
        handle.await_response().await.expect("slow answers");
    }
    let logs = watcher.heard(|h| h.logs.clone());
    assert_eq!(logs.len(), 1, "only the message at the level: {logs:?}");
    assert_eq!(logs[0].data, json!("at the level"));
    assert_eq!(logs[0].logger.as_deref(), Some("notes"));
    assert!(terminate(tether).await.success());
}
