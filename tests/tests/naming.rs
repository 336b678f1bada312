//! The names agents see are the operator's choice (`prefix` per server) and the policy's
//! decision, for tools and prompts alike: a server's own names, a prefix, or the default
//! `<server>__`; collisions fail closed and status names what is withheld; a policy older
//! than contract 0.2.1 keeps working and names as it always did.

use std::collections::BTreeSet;

use rmcp::model::{CallToolRequestParams, GetPromptRequestParams};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::json;
use tether::Tether;
use tether::config::ServerSpec;
use tether::policy::PolicySource;

use crate::common::*;

fn fixture(
    dir: &tempfile::TempDir,
    name: &str,
    prefix: Option<&str>,
    flags: &[&str],
) -> ServerSpec {
    let state = StateDir(dir.path().join(name));
    std::fs::create_dir_all(&state.0).unwrap();
    let mut spec = stdio_fixture(name, &state, flags);
    spec.prefix = prefix.map(str::to_string);
    spec
}

/// Tether on the default policy with `servers`.
async fn start(dir: &tempfile::TempDir, servers: Vec<ServerSpec>) -> Tether {
    let mut builder = Tether::builder()
        .policy_settings(FAST_POLICY)
        .log_dir(dir.path().join("logs"));
    for server in servers {
        builder = builder.server(server);
    }
    builder.start().await.expect("Tether starts")
}

/// An MCP client on the gateway, over an in-process pipe.
async fn client(tether: &Tether) -> RunningService<RoleClient, ()> {
    let (ours, theirs) = tokio::io::duplex(1 << 20);
    let gateway = tether.gateway();
    tokio::spawn(async move {
        if let Ok(service) = gateway.serve(theirs).await {
            let _ = service.waiting().await;
        }
    });
    ().serve(ours).await.expect("an MCP session on the gateway")
}

async fn names(client: &RunningService<RoleClient, ()>) -> (BTreeSet<String>, BTreeSet<String>) {
    let tools = client
        .list_all_tools()
        .await
        .map(|t| t.into_iter().map(|t| t.name.into_owned()).collect())
        .unwrap_or_default();
    let prompts = client
        .list_all_prompts()
        .await
        .map(|p| p.into_iter().map(|p| p.name).collect())
        .unwrap_or_default();
    (tools, prompts)
}

async fn wait_for_names(
    client: &RunningService<RoleClient, ()>,
    what: &str,
    condition: impl Fn(&BTreeSet<String>, &BTreeSet<String>) -> bool,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (tools, prompts) = names(client).await;
        if condition(&tools, &prompts) {
            return (tools, prompts);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}; tools {tools:?}, prompts {prompts:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_chooses_the_names_of_each_servers_tools_and_prompts() {
    let dir = tempfile::tempdir().unwrap();
    let servers = vec![
        fixture(
            &dir,
            "docs",
            Some(""),
            &["--tools", "echo,add", "--prompts", "greet,summarize"],
        ),
        fixture(
            &dir,
            "notes",
            Some("n-"),
            &["--tools", "echo", "--prompts", "greet"],
        ),
        fixture(&dir, "plain", None, &["--tools", "echo"]),
    ];
    let tether = start(&dir, servers).await;
    let client = client(&tether).await;
    let (tools, prompts) = wait_for_names(&client, "all three servers are visible", |t, p| {
        t.len() == 4 && p.len() == 3
    })
    .await;
    let expected = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(tools, expected(&["echo", "add", "n-echo", "plain__echo"]));
    assert_eq!(prompts, expected(&["greet", "summarize", "n-greet"]));

    // The server's own names route to it.
    let result = client
        .call_tool(
            CallToolRequestParams::new("echo")
                .with_arguments(args(json!({"text": "own name"})).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(text(&result), "own name");
    let notes = client
        .call_tool(
            CallToolRequestParams::new("n-echo")
                .with_arguments(args(json!({"text": "prefixed"})).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(text(&notes), "prefixed");
    let docs_state = StateDir(dir.path().join("docs"));
    let notes_state = StateDir(dir.path().join("notes"));
    assert_eq!(docs_state.calls_of("echo"), 1, "echo went to docs");
    assert_eq!(notes_state.calls_of("echo"), 1, "n-echo went to notes");
    let prompt = client
        .get_prompt(
            GetPromptRequestParams::new("n-greet")
                .with_arguments(args(json!({"name": "ada"})).unwrap()),
        )
        .await
        .expect("prompts/get is routed to notes by its prefixed name");
    assert!(format!("{prompt:?}").contains("hello, ada"), "{prompt:?}");
    // Completions name prompts the way lists do.
    let completed = client
        .complete_prompt_simple("greet", "name", "b")
        .await
        .expect("completion of docs' greet by its own name");
    assert_eq!(completed, ["bob"]);

    let status = tether.status().await;
    assert!(
        status.servers.iter().all(|s| s.withheld.is_empty()),
        "{status:?}"
    );
    client.cancel().await.ok();
    tether.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprefixed_servers_whose_names_collide_fail_closed_and_status_says_what_is_withheld() {
    let dir = tempfile::tempdir().unwrap();
    let servers = vec![
        fixture(
            &dir,
            "first",
            Some(""),
            &["--tools", "echo,add", "--prompts", "greet"],
        ),
        fixture(
            &dir,
            "second",
            Some(""),
            &["--tools", "echo,slow", "--prompts", "greet,other"],
        ),
    ];
    let tether = start(&dir, servers).await;
    let client = client(&tether).await;
    // Each server's unique names show; `echo` stays with whichever server published it first;
    // the prompt `greet`, claimed by both, is hidden.
    let (tools, prompts) = wait_for_names(&client, "both servers are visible", |t, p| {
        t.contains("add") && t.contains("slow") && p.contains("other")
    })
    .await;
    assert!(tools.contains("echo"), "one server keeps echo: {tools:?}");
    assert_eq!(tools.len(), 3, "{tools:?}");
    assert!(!prompts.contains("greet"), "{prompts:?}");
    let status = tether.status().await;
    let withheld = |server: &str| {
        status
            .servers
            .iter()
            .find(|s| s.name == server)
            .map(|s| s.withheld.clone())
            .unwrap()
    };
    let (first, second) = (withheld("first"), withheld("second"));
    assert!(first.contains(&"prompt greet".to_string()), "{first:?}");
    assert!(second.contains(&"prompt greet".to_string()), "{second:?}");
    let echo_withheld = [&first, &second]
        .iter()
        .filter(|w| w.contains(&"tool echo".to_string()))
        .count();
    assert_eq!(
        echo_withheld, 1,
        "exactly one server lost echo: {first:?} {second:?}"
    );
    client.cancel().await.ok();
    tether.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_older_than_the_naming_contract_keeps_working_and_names_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let servers = vec![fixture(
        &dir,
        "docs",
        Some(""),
        &["--tools", "echo", "--prompts", "greet"],
    )];
    let policy = PolicySource::File(tether_tests::components::PREVIOUS_MINOR.into());
    let tether = Tether::builder()
        .policy(policy)
        .log_dir(dir.path().join("logs"))
        .server(servers.into_iter().next().unwrap())
        .start()
        .await
        .expect("a 0.2.0 policy loads");
    assert!(tether.status().await.policy.contract.starts_with("0.2.0"));
    let client = client(&tether).await;
    let (tools, prompts) = wait_for_names(&client, "docs is visible", |t, p| {
        !t.is_empty() && !p.is_empty()
    })
    .await;
    assert_eq!(tools, BTreeSet::from(["docs__echo".to_string()]));
    assert_eq!(prompts, BTreeSet::from(["docs__greet".to_string()]));
    client.cancel().await.ok();
    tether.shutdown(std::time::Duration::from_secs(5)).await;
}
