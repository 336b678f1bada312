//! The gateway's own CPU cost per forwarded `tools/call`, in instructions counted by
//! `valgrind --tool=callgrind` (repeatable, unlike wall-clock figures on a shared VM).
//!
//! `tether serve` runs under callgrind on stdio in front of a stdio fixture (the fixture is not
//! traced). A client of each generation makes N echo calls; the same run with no calls is the
//! baseline. Counting starts once the tools are listed and every session is proven (the admin
//! API says `healthy`), and stops before the client leaves (neither start-up nor shutdown is
//! counted):
//! instructions per call = (Ir(N calls) − Ir(0 calls)) / N. `--tether` measures another build
//! (e.g. an older commit's `tether-cli`) with the same client, for a before/after.
//! `--servers N --tools M` adds N−1 more servers offering M generated tools each (the called one
//! offers them too): a call's cost must not grow with what is configured. `--http` measures
//! the Streamable HTTP path instead: the called server is the fixture over HTTP (not traced),
//! the client an HTTP session with `tether serve --http`. `--askable-client` makes the client
//! declare sampling, elicitation and roots, as agents that take servers' requests do.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use crate::gateway::connect_agent;
use crate::util::{self, Agent, echo_ok, scratch, table};

#[derive(clap::Parser)]
pub struct Args {
    /// Calls per measured run.
    #[arg(long, default_value_t = 2000)]
    calls: usize,
    /// The gateway binary to measure (default: the `tether-cli` next to this benchmark).
    #[arg(long)]
    tether: Option<PathBuf>,
    /// Servers configured (each a stdio fixture; the calls go to the first).
    #[arg(long, default_value_t = 1)]
    servers: usize,
    /// Generated tools each server offers besides the fixture's own.
    #[arg(long, default_value_t = 0)]
    tools: usize,
    /// Call `blob` for a result of this many bytes instead of `echo`.
    #[arg(long)]
    result_bytes: Option<usize>,
    /// Keep each measured run's callgrind profile in this directory (for `callgrind_annotate`).
    #[arg(long)]
    keep: Option<PathBuf>,
    /// Streamable HTTP on both sides: client to gateway, gateway to the called server.
    #[arg(long)]
    http: bool,
    /// With `--http`: the called server configured with `keep_connections = true`.
    #[arg(long)]
    keep_connections: bool,
    /// The client declares sampling, elicitation and roots, as agents that take servers'
    /// requests do.
    #[arg(long)]
    askable_client: bool,
}

/// The servers configured, what each measured call is (`echo`, or `blob` with a result of
/// this many bytes), and where to keep the profiles.
#[derive(Clone, Copy)]
struct Load<'a> {
    servers: usize,
    tools: usize,
    result_bytes: Option<usize>,
    keep: Option<&'a Path>,
    /// The called server's URL when it is served over HTTP (`--http`).
    upstream: Option<&'a str>,
    /// Whether tool calls to it keep their connections.
    keep_connections: bool,
    /// Whether the client declares what servers may ask it.
    askable: bool,
}

/// A config of `servers` fixtures with `tools` generated tools each; the first is `up`. Their
/// keepalives are an hour apart, so pings do not differ between the runs compared.
fn config(dir: &Path, state: &Path, load: Load<'_>) -> PathBuf {
    let Load {
        servers,
        tools,
        upstream,
        keep_connections,
        ..
    } = load;
    let path = dir.join("servers.json");
    let mut entries = serde_json::Map::new();
    for i in 0..servers {
        let name = if i == 0 {
            "up".to_string()
        } else {
            format!("s{i}")
        };
        let state = if i == 0 {
            state.to_path_buf()
        } else {
            dir.join(&name)
        };
        std::fs::create_dir_all(&state).unwrap();
        if let (0, Some(url)) = (i, upstream) {
            entries.insert(
                name,
                serde_json::json!({
                    "url": url,
                    "timeouts": {"keepalive": "1h"},
                    "keep_connections": keep_connections,
                }),
            );
            continue;
        }
        entries.insert(
            name,
            serde_json::json!({
                "command": util::fixture(),
                "args": ["--transport", "stdio", "--state-dir", state.display().to_string(),
                         "--generated-tools", tools.to_string(), "--tools", "echo,blob"],
                "timeouts": {"keepalive": "1h"},
            }),
        );
    }
    std::fs::write(
        &path,
        serde_json::json!({ "mcpServers": entries }).to_string(),
    )
    .expect("config");
    path
}

/// Runs `tether serve` under callgrind with `calls` echo calls from a client of the given
/// generation; returns the instructions the gateway process executed.
async fn instructions(
    tether: &Path,
    name: &str,
    modern: bool,
    calls: usize,
    load: Load<'_>,
) -> u64 {
    let dir = scratch(name);
    let state = dir.join("up");
    std::fs::create_dir_all(&state).unwrap();
    let config = config(&dir, &state, load);
    let out = dir.join("callgrind.%p.out");
    let http = load.upstream.is_some();
    let mut serve = Command::new("valgrind");
    serve
        .arg("--tool=callgrind")
        // Counted once every session is proven (see below): start-up, however long with many
        // servers, is not in the totals compared.
        .arg("--instr-atstart=no")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(tether)
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--state-file")
        .arg(dir.join("state.json"))
        .arg("--log-dir")
        .arg(dir.join("logs"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    if http {
        // The address it serves at is in its log.
        serve
            .args(["--http", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped());
    } else {
        serve.env("RUST_LOG", "warn").stderr(Stdio::null());
    }
    let mut serve = serve.spawn().expect("valgrind runs (install valgrind)");
    let pid = serve.id().expect("running");
    let agent = Agent {
        askable: load.askable,
        ..Agent::default()
    };
    let client = if http {
        let log = serve.stderr.take().unwrap();
        let url = util::word_after_within(log, "serving MCP at ", Duration::from_secs(300)).await;
        let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url);
        connect_agent(transport, modern, agent).await
    } else {
        let io = (serve.stdout.take().unwrap(), serve.stdin.take().unwrap());
        connect_agent(io, modern, agent).await
    };
    // Slow polls: every list the client sends is counted in both runs alike.
    let last = match load.servers {
        1 => "up__echo".to_string(),
        n => format!("s{}__echo", n - 1),
    };
    util::wait_for_tool(
        client.peer(),
        &last,
        Duration::from_secs(600),
        Duration::from_millis(200),
    )
    .await;
    // Each session's first keepalive, which proves it, comes KEEPALIVE_FLOOR after it opened:
    // with many servers some open just before readiness. Counting starts once all are proven,
    // so neither run counts those pings (they would be charged to the calls of the longer one).
    all_proven(&dir.join("state.json"), load.servers).await;
    callgrind_control(pid, "--instr=on").await;
    for _ in 0..calls {
        match load.result_bytes {
            Some(bytes) => crate::forwarding::call(client.peer(), "up__blob", bytes).await,
            None => assert!(echo_ok(client.peer(), "up__echo").await, "echo failed"),
        }
    }
    // Counting stops before the client leaves: tearing down what the servers hold at exit
    // is no call's cost (and would differ between the runs compared: a longer run's policy
    // journal is longer).
    callgrind_control(pid, "--instr=off").await;
    // Closing stdin ends `tether serve` on stdio, SIGTERM over HTTP; callgrind writes its
    // counts on exit.
    let _ = client.cancel().await;
    if http {
        util::signal(pid, libc::SIGTERM);
    }
    tokio::time::timeout(Duration::from_secs(300), serve.wait())
        .await
        .expect("tether serve ends under callgrind")
        .expect("waiting for it");
    let profile = dir.join(format!("callgrind.{pid}.out"));
    let text =
        std::fs::read_to_string(&profile).expect("callgrind's output for the gateway process");
    if let Some(keep) = load.keep {
        let _ = std::fs::create_dir_all(keep);
        let _ = std::fs::copy(&profile, keep.join(format!("{name}.callgrind")));
    }
    // `totals:` ends the counts; the header's `summary:` says 0 once counting was turned off.
    let total = |key: &str| {
        text.lines()
            .rev()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|n| n.split_whitespace().next()?.parse().ok())
    };
    total("totals:")
        .or_else(|| total("summary:"))
        .expect("an instruction total in callgrind's output")
}

/// Waits until the admin API of the gateway that wrote `state_file` reports `servers` servers,
/// every one `healthy` (its session proven).
async fn all_proven(state_file: &Path, servers: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    let http = reqwest::Client::new();
    let proven = |status: &serde_json::Value| {
        status["servers"].as_array().is_some_and(|rows| {
            rows.len() == servers && rows.iter().all(|row| row["state"] == "healthy")
        })
    };
    loop {
        let status = admin_status(&http, state_file).await;
        if status.as_ref().is_some_and(proven) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sessions were not all proven within 600 s: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The admin API's `/status` of the gateway that wrote `state_file`, once it answers.
async fn admin_status(http: &reqwest::Client, state_file: &Path) -> Option<serde_json::Value> {
    let state: serde_json::Value = serde_json::from_slice(&std::fs::read(state_file).ok()?).ok()?;
    let (addr, token) = (state["addr"].as_str()?, state["token"].as_str()?);
    let response = http
        .get(format!("http://{addr}/status"))
        .bearer_auth(token)
        .send()
        .await
        .ok()?;
    serde_json::from_slice(&response.bytes().await.ok()?).ok()
}

/// Turns callgrind's counting in the gateway process on or off.
async fn callgrind_control(pid: u32, command: &str) {
    let done = Command::new("callgrind_control")
        .args([command, &pid.to_string()])
        .stdout(Stdio::null())
        .status()
        .await
        .expect("callgrind_control runs");
    assert!(done.success(), "callgrind_control {command} failed");
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let tether = args
        .tether
        .clone()
        .unwrap_or_else(|| util::sibling("tether-cli"));
    println!(
        "\n## gateway-cost: instructions `{}` executes per forwarded call (callgrind, {}{}, {} calls of {}, {} servers of {} generated tools)\n",
        tether.display(),
        if args.http {
            "Streamable HTTP"
        } else {
            "stdio"
        },
        if args.askable_client {
            ", a client declaring sampling, elicitation and roots"
        } else {
            ""
        },
        args.calls,
        match args.result_bytes {
            Some(bytes) => format!("blob ({bytes} B results)"),
            None => "echo".to_string(),
        },
        args.servers,
        args.tools
    );
    let rt = util::runtime();
    // Over HTTP the called server runs for the whole benchmark, outside callgrind.
    let upstream = args.http.then(|| {
        let state = scratch("cost-upstream");
        let tools = args.tools.to_string();
        let extra = ["--tools", "echo,blob", "--generated-tools", &tools];
        rt.block_on(util::fixture_listening("http", &state, &extra))
    });
    let url = upstream.as_ref().map(|(_, base)| format!("{base}/mcp"));
    let fleet = Load {
        servers: args.servers,
        tools: args.tools,
        result_bytes: args.result_bytes,
        keep: args.keep.as_deref(),
        upstream: url.as_deref(),
        keep_connections: args.keep_connections,
        askable: args.askable_client,
    };
    // A first start compiles the policy into the cache; the measured runs load it.
    let warm = Load {
        servers: 1,
        tools: 0,
        result_bytes: None,
        keep: None,
        upstream: None,
        keep_connections: false,
        askable: false,
    };
    rt.block_on(instructions(&tether, "cost-warm", false, 0, warm));
    let mut rows = Vec::new();
    for (modern, label) in [(false, "2025-11-25"), (true, "2026-07-28")] {
        let (base, loaded) = rt.block_on(async {
            let base = instructions(&tether, &format!("cost-{label}-0"), modern, 0, fleet).await;
            let loaded = instructions(
                &tether,
                &format!("cost-{label}-n"),
                modern,
                args.calls,
                fleet,
            )
            .await;
            (base, loaded)
        });
        let per_call = loaded.saturating_sub(base) as f64 / args.calls as f64;
        rows.push(vec![
            label.to_string(),
            base.to_string(),
            loaded.to_string(),
            format!("{per_call:.0}"),
        ]);
    }
    table(
        &[
            "client protocol",
            "Ir, 0 calls",
            &format!("Ir, {} calls", args.calls),
            "Ir per call",
        ],
        &rows,
    );
    Ok(())
}
