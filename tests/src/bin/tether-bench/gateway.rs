//! Gateway overhead: echo-tool calls from one rmcp client, directly to a fixture server and
//! through `tether serve` in front of the same fixture, over stdio and Streamable HTTP, at
//! concurrency 1 and 16. Direct and gateway rounds alternate so drift hits both alike.
//! With `--mcp-hub`, also mcp-hub, over legacy HTTP+SSE (its only downstream transport),
//! against the fixture over SSE directly.

use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::service::{Peer, RunningService};
use rmcp::{RoleClient, ServiceExt};
use tether::transport::http::{HttpOptions, connect_sse};
use tokio::process::{Child, Command};

use crate::stats::{Measured, Samples, us, us_delta};
use crate::util::{self, Agent, echo_ok, scratch, table, tool_names, word_after};

#[derive(clap::Parser)]
pub struct Args {
    /// Calls per measurement (split over the concurrent callers).
    #[arg(long, default_value_t = 4000)]
    calls: usize,
    /// Alternating direct/gateway rounds.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Concurrency levels.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    concurrency: Vec<usize>,
    /// Also measure mcp-hub (path to its `mcp-hub` executable) in front of a stdio fixture.
    #[arg(long)]
    mcp_hub: Option<std::path::PathBuf>,
    /// Also measure another build of `tether-cli` (e.g. an older commit's) in the same rounds.
    #[arg(long)]
    baseline_tether: Option<std::path::PathBuf>,
}

#[derive(Clone, Copy)]
enum Transport {
    Stdio,
    Http,
    /// Legacy HTTP+SSE, through Tether's client transport (rmcp has none).
    Sse,
}

impl Transport {
    fn label(self) -> &'static str {
        match self {
            Transport::Stdio => "stdio",
            Transport::Http => "http",
            Transport::Sse => "sse",
        }
    }
}

/// What the client's calls go through to reach the fixture.
#[derive(Clone, Copy)]
enum Route {
    Direct,
    Tether,
    /// `tether serve` for a client of protocol 2026-07-28 (no `initialize`).
    TetherModern,
    /// `tether serve` of `--baseline-tether`, for the same client as `Tether`.
    TetherBaseline,
    InProcess,
    McpHub,
}

impl Route {
    fn label(self) -> &'static str {
        match self {
            Route::Direct => "direct",
            Route::Tether => "tether serve",
            Route::TetherModern => "tether serve, 2026-07-28 client",
            Route::TetherBaseline => "tether serve, baseline build",
            Route::InProcess => "Supervisor::call_tool (in-process, no downstream hop)",
            Route::McpHub => "mcp-hub 4.2.1",
        }
    }
}

/// A connected client, and the processes behind it (killed on drop).
struct Setup {
    client: RunningService<RoleClient, Agent>,
    tool: String,
    _children: Vec<Child>,
}

/// Tether's legacy SSE client settings, as for a configured upstream without headers.
fn sse_options() -> HttpOptions {
    HttpOptions {
        headers: Default::default(),
        connect_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(30),
        max_message: tether::config::ServerSpec::DEFAULT_MAX_MESSAGE,
        keep_connections: false,
        lifecycle: tether::transport::generation::lifecycle(Default::default(), None),
        routes: None,
        auth: None,
    }
}

async fn direct(transport: Transport, name: &str) -> Setup {
    let state = scratch(name);
    match transport {
        Transport::Stdio => {
            let mut child = util::spawn_stdio_fixture(&state);
            let client = util::serve_over_stdio(&mut child, Agent::default()).await;
            Setup {
                client,
                tool: "echo".into(),
                _children: vec![child],
            }
        }
        Transport::Http => {
            let (child, base) = util::fixture_listening("http", &state, &[]).await;
            let transport =
                rmcp::transport::StreamableHttpClientTransport::from_uri(format!("{base}/mcp"));
            let client = Agent::default()
                .serve(transport)
                .await
                .expect("MCP over HTTP");
            Setup {
                client,
                tool: "echo".into(),
                _children: vec![child],
            }
        }
        Transport::Sse => {
            let (child, base) = util::fixture_listening("sse", &state, &[]).await;
            let client = connect_sse(&format!("{base}/sse"), &sse_options(), Agent::default())
                .await
                .expect("MCP over SSE");
            Setup {
                client,
                tool: "echo".into(),
                _children: vec![child],
            }
        }
    }
}

/// The bench's client of `generation` on `transport` (stdio: the child's pipes).
pub async fn connect_client<T, E, A>(
    transport: T,
    modern: bool,
) -> RunningService<RoleClient, Agent>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    connect_agent(transport, modern, Agent::default()).await
}

/// As [`connect_client`], with `agent` as the client.
pub async fn connect_agent<T, E, A>(
    transport: T,
    modern: bool,
    agent: Agent,
) -> RunningService<RoleClient, Agent>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    use rmcp::ClientServiceExt;
    let lifecycle = if modern {
        rmcp::ClientLifecycleMode::Discover {
            preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
        }
    } else {
        rmcp::ClientLifecycleMode::Initialize
    };
    agent
        .serve_with_lifecycle(transport, lifecycle)
        .await
        .expect("an MCP session with the gateway")
}

async fn through_tether(
    transport: Transport,
    name: &str,
    modern: bool,
    binary: Option<&std::path::Path>,
) -> Setup {
    let binary = binary
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| util::sibling("tether-cli"));
    let dir = scratch(name);
    let state = dir.join("up");
    std::fs::create_dir_all(&state).unwrap();
    let setup = match transport {
        Transport::Stdio => {
            let config = util::stdio_config(&dir, &state);
            let mut tether = util::tether_serve_with(&binary, &dir, &config, &[], "info", false);
            let io = (tether.stdout.take().unwrap(), tether.stdin.take().unwrap());
            let client = connect_client(io, modern).await;
            Setup {
                client,
                tool: "up__echo".into(),
                _children: vec![tether],
            }
        }
        Transport::Http => {
            let (upstream, base) = util::fixture_listening("http", &state, &[]).await;
            let config = dir.join("servers.json");
            let json = serde_json::json!({"mcpServers": {"up": {"url": format!("{base}/mcp")}}});
            std::fs::write(&config, json.to_string()).unwrap();
            let mut tether = util::tether_serve_with(
                &binary,
                &dir,
                &config,
                &["--http", "127.0.0.1:0"],
                "info",
                true,
            );
            let url = word_after(tether.stderr.take().unwrap(), "serving MCP at ").await;
            let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url);
            let client = connect_client(transport, modern).await;
            Setup {
                client,
                tool: "up__echo".into(),
                _children: vec![tether, upstream],
            }
        }
        Transport::Sse => unreachable!("tether serve serves stdio and Streamable HTTP only"),
    };
    util::wait_for_tool(
        setup.client.peer(),
        "up__echo",
        Duration::from_secs(30),
        Duration::from_millis(10),
    )
    .await;
    setup
}

/// mcp-hub (a peer gateway, Node.js) on its `/mcp` endpoint, which speaks only legacy
/// HTTP+SSE (`GET /mcp` names `/messages?sessionId=` to POST to). Its upstream is a stdio
/// fixture, as in the `tether serve` stdio row: the baseline is the fixture over SSE directly,
/// so mcp-hub's extra hop is the one to stdio.
async fn through_mcp_hub(hub: &std::path::Path, name: &str) -> Setup {
    let dir = scratch(name);
    let state = dir.join("up");
    std::fs::create_dir_all(&state).unwrap();
    let config = util::stdio_config(&dir, &state);
    let port = util::free_port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let child = Command::new(hub)
        .args(["--port", &port.to_string(), "--config"])
        .arg(&config)
        .env("XDG_STATE_HOME", &dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("mcp-hub starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(client) = connect_sse(&url, &sse_options(), Agent::default()).await {
            if let Some(tool) = tool_names(client.peer())
                .await
                .into_iter()
                .find(|t| t.ends_with("echo"))
            {
                return Setup {
                    client,
                    tool,
                    // The fixture is mcp-hub's child: it ends with its stdin when mcp-hub dies.
                    _children: vec![child],
                };
            }
            let _ = client.cancel().await;
        }
        assert!(
            Instant::now() < deadline,
            "mcp-hub never listed the echo tool"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The host's call path alone: `Supervisor::call_tool` in this process (admission, routing,
/// the upstream call, the report) on a stdio fixture, without the downstream MCP hop.
async fn in_process(name: &str, concurrency: usize, calls: usize) -> (Vec<Duration>, Duration) {
    let dir = scratch(name);
    let engine = tether::policy::PolicyEngine::new(None).expect("engine");
    let supervisor = crate::swap::start_supervisor(&dir, engine).expect("supervisor");
    supervisor
        .add_server(crate::swap::fixture_spec("up", &dir.join("up")))
        .expect("add");
    while supervisor.registry().server_tools("up").is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let arguments = serde_json::json!({"text": "hi"}).as_object().cloned();
    let run = async |concurrency: usize, calls: usize| {
        let start = Instant::now();
        let callers: Vec<_> = (0..concurrency)
            .map(|_| {
                let (supervisor, arguments) = (supervisor.clone(), arguments.clone());
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    for _ in 0..calls / concurrency {
                        let t = Instant::now();
                        let result = supervisor.call_tool("up__echo", arguments.clone()).await;
                        assert!(
                            matches!(result, Ok(r) if r.is_error != Some(true)),
                            "echo failed"
                        );
                        latencies.push(t.elapsed());
                    }
                    latencies
                })
            })
            .collect();
        let mut all = Vec::new();
        for caller in callers {
            all.extend(caller.await.expect("caller"));
        }
        (all, start.elapsed())
    };
    run(1, 300).await; // warm up
    let measured = run(concurrency, calls).await;
    supervisor.shutdown().await;
    measured
}

/// Per-call latencies of `calls` echo calls from `concurrency` callers, and the wall time.
async fn load(
    peer: &Peer<RoleClient>,
    tool: &str,
    concurrency: usize,
    calls: usize,
) -> (Vec<Duration>, Duration) {
    let per_caller = calls / concurrency;
    let start = Instant::now();
    let callers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (peer, tool) = (peer.clone(), tool.to_string());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_caller);
                for _ in 0..per_caller {
                    let t = Instant::now();
                    assert!(echo_ok(&peer, &tool).await, "echo failed");
                    latencies.push(t.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::with_capacity(calls);
    for caller in callers {
        all.extend(caller.await.expect("caller"));
    }
    (all, start.elapsed())
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    println!(
        "\n## gateway: echo calls, one rmcp client, {} calls per measurement, {} alternating rounds\n",
        args.calls, args.rounds
    );
    let rt = util::runtime();
    let mut rows = Vec::new();
    let mut transports = vec![Transport::Stdio, Transport::Http];
    if args.mcp_hub.is_some() {
        transports.push(Transport::Sse);
    }
    for transport in transports {
        let label = transport.label();
        let routes = match transport {
            Transport::Stdio => vec![
                Route::Direct,
                Route::Tether,
                Route::TetherModern,
                Route::InProcess,
            ],
            Transport::Http => vec![Route::Direct, Route::Tether, Route::TetherModern],
            Transport::Sse => vec![Route::Direct, Route::McpHub],
        };
        let mut routes = routes;
        if args.baseline_tether.is_some() && !matches!(transport, Transport::Sse) {
            routes.insert(2, Route::TetherBaseline);
        }
        for &concurrency in &args.concurrency {
            let mut results: Vec<Measured> = routes.iter().map(|_| Measured::default()).collect();
            for round in 0..args.rounds {
                for (i, (&route, result)) in routes.iter().zip(&mut results).enumerate() {
                    let (latencies, wall) = rt.block_on(async {
                        let name = format!("gw-{label}-{concurrency}-{round}-{i}");
                        let setup = match route {
                            Route::InProcess => {
                                return in_process(&name, concurrency, args.calls).await;
                            }
                            Route::Direct => direct(transport, &name).await,
                            Route::Tether => through_tether(transport, &name, false, None).await,
                            Route::TetherModern => {
                                through_tether(transport, &name, true, None).await
                            }
                            Route::TetherBaseline => {
                                let baseline = args.baseline_tether.as_deref();
                                through_tether(transport, &name, false, baseline).await
                            }
                            Route::McpHub => {
                                through_mcp_hub(args.mcp_hub.as_ref().unwrap(), &name).await
                            }
                        };
                        let peer = setup.client.peer().clone();
                        load(&peer, &setup.tool, 1, 300).await; // warm up
                        let measured = load(&peer, &setup.tool, concurrency, args.calls).await;
                        let _ = setup.client.cancel().await;
                        measured
                    });
                    result.latencies.extend(latencies);
                    result.wall += wall;
                }
            }
            let samples: Vec<Samples> = results
                .iter()
                .map(|r| Samples::from_durations(&r.latencies))
                .collect();
            for (i, route) in routes.iter().enumerate() {
                rows.push(vec![
                    label.to_string(),
                    concurrency.to_string(),
                    route.label().to_string(),
                    us(samples[i].median()),
                    us(samples[i].quantile(0.99)),
                    format!("{:.0}", results[i].rate()),
                    if i == 0 {
                        "-".into()
                    } else {
                        format!(
                            "{} p50, {} p99, {:.2}× calls/s",
                            us_delta(samples[i].median(), samples[0].median()),
                            us_delta(samples[i].quantile(0.99), samples[0].quantile(0.99)),
                            results[i].rate() / results[0].rate()
                        )
                    },
                ]);
            }
        }
    }
    table(
        &[
            "transport",
            "concurrency",
            "path",
            "p50",
            "p99",
            "calls/s",
            "vs direct",
        ],
        &rows,
    );
    println!("target: ≤ 50 µs added p50\n");
    Ok(())
}
