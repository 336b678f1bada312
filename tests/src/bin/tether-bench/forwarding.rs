//! The benchmark of record for forwarding (docs/BENCHMARKS.md, "Forwarding"): tool calls whose
//! results are 100 B, 100 KB and 2 MB, from 1, 16 and 64 concurrent clients, over stdio and
//! Streamable HTTP, on three paths measured in the same run and rounds:
//!
//! - **direct**: the client talks to `mcp-fixture`;
//! - **relay**: through socat copying the bytes (one more process, no parsing): the floor for
//!   anything in the path. On stdio socat runs the fixture (`EXEC:`); on HTTP it relays TCP,
//!   a process per connection (`--http-relay haproxy`: HAProxy in TCP mode, event-driven;
//!   `--http-relay haproxy-http`: HAProxy in HTTP mode, which parses every request and answer
//!   and writes them again as an HTTP gateway must, without understanding MCP);
//! - **tether**: through `tether serve` in front of the same fixture.
//!
//! On HTTP each client is its own MCP session; on stdio a server has one client, so the
//! concurrent clients are concurrent callers on that session. Besides latency (p50, p99) and
//! throughput, it reports Tether's added p50 as a multiple of the relay's, Tether's throughput as
//! a share of direct, and Tether's resident memory per client session (HTTP, 1 session vs 64).
//! It also reports the CPU time each process spends per call (the clients, the server, Tether):
//! when the direct path keeps the cores all busy, throughput through Tether over direct's can be
//! no better than the CPU a call costs all processes on the direct path over what it costs them
//! through Tether (and is exactly that when the Tether path keeps them as busy).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::model::CallToolRequestParams;
use rmcp::service::{Peer, RunningService};
use rmcp::{RoleClient, ServiceExt};
use tokio::process::{Child, Command};

use crate::stats::{Measured, Samples, us};
use crate::util::{self, Agent, fixture, scratch, table, word_after};

#[derive(clap::Parser)]
pub struct Args {
    /// Result sizes, in bytes.
    #[arg(long, value_delimiter = ',', default_value = "100,102400,2097152")]
    sizes: Vec<usize>,
    /// Concurrent clients.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    concurrency: Vec<usize>,
    /// Result bytes per measurement: calls = this / size, within --min-calls and --max-calls.
    #[arg(long, default_value_t = 256 << 20)]
    volume: usize,
    #[arg(long, default_value_t = 2000)]
    max_calls: usize,
    #[arg(long, default_value_t = 128)]
    min_calls: usize,
    /// Rounds; each round sets every path up afresh and measures every size and concurrency.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Transports to measure.
    #[arg(long, value_delimiter = ',', default_value = "stdio,http")]
    transports: Vec<String>,
    /// The byte relay (Debian: `apt-get install socat`).
    #[arg(long, default_value = "socat")]
    socat: PathBuf,
    /// The TCP relay in front of the HTTP server: `socat` (a process per connection) or
    /// `haproxy` (Debian: `apt-get install haproxy`; one event-driven process in TCP mode) or
    /// `haproxy-http` (the same in HTTP mode: an HTTP proxy, not a byte relay).
    #[arg(long, value_enum, default_value_t = HttpRelay::Socat)]
    http_relay: HttpRelay,
    /// HAProxy, for `--http-relay haproxy` and `haproxy-http`.
    #[arg(long, default_value = "haproxy")]
    haproxy: PathBuf,
    /// Configure Tether's HTTP server with `keep_connections = true`.
    #[arg(long)]
    keep_connections: bool,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum HttpRelay {
    Socat,
    Haproxy,
    HaproxyHttp,
}

impl HttpRelay {
    fn is_haproxy(self) -> bool {
        matches!(self, HttpRelay::Haproxy | HttpRelay::HaproxyHttp)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Path3 {
    Direct,
    Relay,
    Tether,
}

const PATHS: [Path3; 3] = [Path3::Direct, Path3::Relay, Path3::Tether];

impl Path3 {
    fn label(self, transport: &str, http_relay: HttpRelay) -> String {
        match (self, transport) {
            (Path3::Direct, _) => "direct".into(),
            (Path3::Relay, "http") if http_relay == HttpRelay::Haproxy => "relay (haproxy)".into(),
            (Path3::Relay, "http") if http_relay == HttpRelay::HaproxyHttp => {
                "proxy (haproxy http)".into()
            }
            (Path3::Relay, _) => "relay (socat)".into(),
            (Path3::Tether, _) => "tether serve".into(),
        }
    }
}

/// HAProxy relaying from `port` to `addr` in `mode` (`tcp` or `http`), in the foreground (one
/// process, killed on drop), its config and log in `dir`.
fn haproxy(program: &Path, dir: &Path, port: u16, addr: &str, mode: &str) -> Child {
    let config = dir.join("haproxy.cfg");
    let text = format!(
        "global\n  maxconn 4096\ndefaults\n  mode {mode}\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\nfrontend in\n  bind 127.0.0.1:{port}\n  default_backend up\nbackend up\n  server up {addr}\n"
    );
    std::fs::write(&config, text).expect("the relay's config is written");
    // Its complaints kept: a relay that does not start would otherwise show only as a port
    // nobody listens on.
    let log = std::fs::File::create(dir.join("haproxy.log")).expect("the relay's log is made");
    Command::new(program)
        .arg("-db")
        .arg("-f")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("the relay starts")
}

/// One path, set up: its clients (one on stdio, one per concurrent client on HTTP), the tool's
/// name on it, and the processes behind it (killed on drop).
struct Setup {
    clients: Vec<RunningService<RoleClient, Agent>>,
    tool: String,
    /// The gateway's pid, on the tether path.
    gateway: Option<u32>,
    /// The fixture's pid (it writes it to its state directory).
    server: u32,
    /// Tether's resident memory with one client session and with all of them (HTTP).
    rss_kb: Option<(u64, u64)>,
    _children: Vec<Child>,
}

fn fixture_args(transport: &str, state: &Path) -> Vec<String> {
    vec![
        "--transport".into(),
        transport.into(),
        "--state-dir".into(),
        state.display().to_string(),
        "--tools".into(),
        "blob".into(),
    ]
}

async fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Resident memory of a process, in kB.
fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time (user and system, all its threads, those ended too) a process has used so far, to
/// the nanosecond (its CPU-time clock; `/proc/PID/stat` counts in 10 ms ticks).
fn cpu_time(pid: u32) -> Duration {
    let mut clock: libc::clockid_t = 0;
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: both calls only write through the pointers given, which outlive them.
    let read = unsafe {
        libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) == 0
            && libc::clock_gettime(clock, &mut now) == 0
    };
    assert!(read, "the CPU time of process {pid} cannot be read");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// CPU time of the path's processes: this one (the clients), the server, the gateway.
fn cpu_now(setup: &Setup) -> [Duration; 3] {
    [
        cpu_time(std::process::id()),
        cpu_time(setup.server),
        setup.gateway.map(cpu_time).unwrap_or_default(),
    ]
}

/// The pid the fixture wrote to its state directory before it served (so before any client
/// got through to it).
fn server_pid(state: &Path) -> u32 {
    std::fs::read_to_string(state.join("pid"))
        .ok()
        .and_then(|pid| pid.trim().parse().ok())
        .expect("the fixture wrote its pid")
}

/// A process of the path, its stdin and stdout piped (a stdio client talks over them).
fn spawn(program: impl AsRef<std::ffi::OsStr>, args: &[String]) -> Child {
    Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("a benchmark process starts")
}

async fn stdio_client(child: &mut Child) -> RunningService<RoleClient, Agent> {
    util::serve_over_stdio(child, Agent::default()).await
}

async fn http_clients(url: &str, count: usize) -> Vec<RunningService<RoleClient, Agent>> {
    let mut clients = Vec::with_capacity(count);
    for _ in 0..count {
        let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.to_string());
        clients.push(
            Agent::default()
                .serve(transport)
                .await
                .expect("an MCP session over HTTP"),
        );
    }
    clients
}

async fn set_up(transport: &str, path: Path3, args: &Args, sessions: usize, name: &str) -> Setup {
    let socat = &args.socat;
    let dir = scratch(name);
    let state = dir.join("up");
    std::fs::create_dir_all(&state).unwrap();
    let mut children = Vec::new();
    let mut gateway = None;
    let mut rss = None;
    let (clients, tool) = match (transport, path) {
        ("stdio", Path3::Direct) => {
            let mut child = spawn(fixture(), &fixture_args("stdio", &state));
            let client = stdio_client(&mut child).await;
            children.push(child);
            (vec![client], "blob".to_string())
        }
        ("stdio", Path3::Relay) => {
            let exec = format!(
                "EXEC:{} {}",
                fixture(),
                fixture_args("stdio", &state).join(" ")
            );
            let mut child = spawn(socat, &["STDIO".into(), exec]);
            let client = stdio_client(&mut child).await;
            children.push(child);
            (vec![client], "blob".to_string())
        }
        ("stdio", Path3::Tether) => {
            let config = dir.join("servers.json");
            let json = serde_json::json!({"mcpServers": {"up": {
                "command": fixture(), "args": fixture_args("stdio", &state),
            }}});
            std::fs::write(&config, json.to_string()).unwrap();
            let binary = util::sibling("tether-cli");
            let mut tether = util::tether_serve_with(&binary, &dir, &config, &[], "warn", false);
            let client = stdio_client(&mut tether).await;
            util::wait_for_tool(
                client.peer(),
                "up__blob",
                Duration::from_secs(30),
                Duration::from_millis(10),
            )
            .await;
            gateway = tether.id();
            children.push(tether);
            (vec![client], "up__blob".to_string())
        }
        (_, path) => {
            let (upstream, base) =
                util::fixture_listening("http", &state, &["--tools", "blob"]).await;
            let addr = base.trim_start_matches("http://").to_string();
            children.push(upstream);
            match path {
                Path3::Direct => (
                    http_clients(&format!("http://{addr}/mcp"), sessions).await,
                    "blob".to_string(),
                ),
                Path3::Relay => {
                    let port = util::free_port();
                    let relay = match args.http_relay {
                        HttpRelay::Haproxy => haproxy(&args.haproxy, &dir, port, &addr, "tcp"),
                        HttpRelay::HaproxyHttp => haproxy(&args.haproxy, &dir, port, &addr, "http"),
                        HttpRelay::Socat => spawn(
                            socat,
                            &[
                                format!(
                                    "TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,backlog=1024"
                                ),
                                format!("TCP:{addr}"),
                            ],
                        ),
                    };
                    children.push(relay);
                    wait_listening(port).await;
                    (
                        http_clients(&format!("http://127.0.0.1:{port}/mcp"), sessions).await,
                        "blob".to_string(),
                    )
                }
                Path3::Tether => {
                    let config = dir.join("servers.json");
                    let json = serde_json::json!({"mcpServers": {"up": {
                        "url": format!("http://{addr}/mcp"),
                        "keep_connections": args.keep_connections,
                    }}});
                    std::fs::write(&config, json.to_string()).unwrap();
                    let binary = util::sibling("tether-cli");
                    let mut tether = util::tether_serve_with(
                        &binary,
                        &dir,
                        &config,
                        &["--http", "127.0.0.1:0"],
                        "info",
                        true,
                    );
                    let url = word_after(tether.stderr.take().unwrap(), "serving MCP at ").await;
                    let pid = tether.id().expect("tether runs");
                    children.push(tether);
                    let mut clients = http_clients(&url, 1).await;
                    util::wait_for_tool(
                        clients[0].peer(),
                        "up__blob",
                        Duration::from_secs(30),
                        Duration::from_millis(10),
                    )
                    .await;
                    // Warm one session up before measuring the memory the others add.
                    for _ in 0..8 {
                        call(clients[0].peer(), "up__blob", 100).await;
                    }
                    let one = rss_kb(pid);
                    clients.extend(http_clients(&url, sessions - 1).await);
                    for client in &clients {
                        call(client.peer(), "up__blob", 100).await;
                    }
                    rss = Some((one, rss_kb(pid)));
                    gateway = Some(pid);
                    (clients, "up__blob".to_string())
                }
            }
        }
    };
    Setup {
        clients,
        tool,
        gateway,
        server: server_pid(&state),
        rss_kb: rss,
        _children: children,
    }
}

fn blob_params(tool: &str, bytes: usize) -> CallToolRequestParams {
    let args = serde_json::json!({ "bytes": bytes });
    CallToolRequestParams::new(tool.to_string()).with_arguments(args.as_object().unwrap().clone())
}

/// One call for `bytes` of result; panics unless exactly that much text came back.
pub(crate) async fn call(peer: &Peer<RoleClient>, tool: &str, bytes: usize) {
    let result = peer
        .call_tool(blob_params(tool, bytes))
        .await
        .expect("the call is answered");
    let text: usize = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.len()))
        .sum();
    assert!(
        result.is_error != Some(true) && text == bytes,
        "{tool} answered {text} bytes, not {bytes}"
    );
}

/// `calls` calls from `concurrency` clients (HTTP: one session each; stdio: callers on the one
/// session): per-call latencies and the wall time.
async fn load(
    setup: &Setup,
    bytes: usize,
    concurrency: usize,
    calls: usize,
) -> (Vec<Duration>, Duration) {
    let per_client = calls.div_ceil(concurrency).max(2);
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|i| {
            let peer = setup.clients[i % setup.clients.len()].peer().clone();
            let tool = setup.tool.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_client);
                for _ in 0..per_client {
                    let t = Instant::now();
                    call(&peer, &tool, bytes).await;
                    latencies.push(t.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::with_capacity(per_client * concurrency);
    for task in tasks {
        all.extend(task.await.expect("a client"));
    }
    (all, start.elapsed())
}

fn size_label(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KB", b >> 10),
        b => format!("{b} B"),
    }
}

/// Whether `program` runs and succeeds with `arg` (a version flag).
fn runs(program: &Path, arg: &str) -> bool {
    std::process::Command::new(program)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let over_http = args.transports.iter().any(|t| t == "http");
    let socat_relays = args.transports.iter().any(|t| t == "stdio")
        || (over_http && args.http_relay == HttpRelay::Socat);
    anyhow::ensure!(
        !socat_relays || runs(&args.socat, "-V"),
        "{} does not run: the relay baseline needs socat (Debian: apt-get install socat)",
        args.socat.display()
    );
    if over_http && args.http_relay.is_haproxy() {
        anyhow::ensure!(
            runs(&args.haproxy, "-v"),
            "haproxy does not run: --http-relay haproxy needs it (Debian: apt-get install haproxy)"
        );
    }
    println!(
        "\n## forwarding: results of {:?} bytes from {:?} concurrent clients, {} rounds\n",
        args.sizes, args.concurrency, args.rounds
    );
    let rt = util::runtime();
    let sessions = args.concurrency.iter().copied().max().unwrap_or(1);
    for transport in &args.transports {
        let transport = transport.as_str();
        anyhow::ensure!(
            matches!(transport, "stdio" | "http"),
            "unknown transport {transport}: stdio or http"
        );
        // measured[path][size][concurrency]
        let mut measured: Vec<Vec<Vec<Measured>>> = PATHS
            .iter()
            .map(|_| {
                args.sizes
                    .iter()
                    .map(|_| {
                        args.concurrency
                            .iter()
                            .map(|_| Measured::default())
                            .collect()
                    })
                    .collect()
            })
            .collect();
        // cpu[path][size][concurrency]: the clients', the server's and the gateway's CPU time.
        let mut cpu = vec![
            vec![vec![[Duration::ZERO; 3]; args.concurrency.len()]; args.sizes.len()];
            PATHS.len()
        ];
        let mut memory = Vec::new();
        for round in 0..args.rounds {
            for (p, &path) in PATHS.iter().enumerate() {
                let name = format!("forwarding-{transport}-{p}-{round}");
                let setup = rt.block_on(set_up(transport, path, args, sessions, &name));
                if let Some(rss) = setup.rss_kb {
                    memory.push(rss);
                }
                if let (Some(pid), "stdio") = (setup.gateway, transport) {
                    let rss = rss_kb(pid);
                    memory.push((rss, rss));
                }
                for (s, &bytes) in args.sizes.iter().enumerate() {
                    let calls = (args.volume / bytes.max(1)).clamp(args.min_calls, args.max_calls);
                    rt.block_on(load(&setup, bytes, 1, 8)); // warm-up
                    for (c, &concurrency) in args.concurrency.iter().enumerate() {
                        let before = cpu_now(&setup);
                        let (latencies, wall) =
                            rt.block_on(load(&setup, bytes, concurrency, calls));
                        let after = cpu_now(&setup);
                        let cell = &mut measured[p][s][c];
                        cell.latencies.extend(latencies);
                        cell.wall += wall;
                        for (spent, (after, before)) in
                            cpu[p][s][c].iter_mut().zip(after.iter().zip(before))
                        {
                            *spent += after.saturating_sub(before);
                        }
                    }
                }
                rt.block_on(async {
                    for client in setup.clients {
                        let _ = client.cancel().await;
                    }
                });
            }
        }
        println!("### {transport}\n");
        let mut rows = Vec::new();
        let mut summary = Vec::new();
        let mut cpu_rows = Vec::new();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        for (s, &bytes) in args.sizes.iter().enumerate() {
            for (c, &concurrency) in args.concurrency.iter().enumerate() {
                let p50 = |p: usize| Samples::from_durations(&measured[p][s][c].latencies).median();
                let direct = p50(0);
                for (p, path) in PATHS.iter().enumerate() {
                    let cell = &measured[p][s][c];
                    let samples = Samples::from_durations(&cell.latencies);
                    rows.push(vec![
                        size_label(bytes),
                        concurrency.to_string(),
                        path.label(transport, args.http_relay),
                        us(samples.median()),
                        us(samples.quantile(0.99)),
                        format!("{:.0}", cell.rate()),
                        match p {
                            0 => String::new(),
                            _ => format!(
                                "{:+.1} µs",
                                (samples.median() as f64 - direct as f64) / 1e3
                            ),
                        },
                    ]);
                }
                // Indices into PATHS and into a cell's CPU times.
                const DIRECT: usize = 0;
                const TETHER: usize = 2;
                const CLIENTS: usize = 0;
                const SERVER: usize = 1;
                const GATEWAY: usize = 2;
                let per_call = |p: usize, process: usize| {
                    cpu[p][s][c][process].as_secs_f64() * 1e6
                        / measured[p][s][c].latencies.len().max(1) as f64
                };
                for p in [DIRECT, TETHER] {
                    let cell = &measured[p][s][c];
                    let total: Duration = cpu[p][s][c].iter().sum();
                    cpu_rows.push(vec![
                        size_label(bytes),
                        concurrency.to_string(),
                        PATHS[p].label(transport, args.http_relay),
                        format!("{:.0} µs", per_call(p, CLIENTS)),
                        format!("{:.0} µs", per_call(p, SERVER)),
                        match p {
                            DIRECT => String::new(),
                            _ => format!("{:.0} µs", per_call(p, GATEWAY)),
                        },
                        format!(
                            "{:.0} %",
                            total.as_secs_f64() / (cell.wall.as_secs_f64() * cores) * 100.0
                        ),
                    ]);
                }
                // What the CPU allows when the cores are full on both paths.
                let cpu_share = (per_call(DIRECT, CLIENTS) + per_call(DIRECT, SERVER))
                    / [CLIENTS, SERVER, GATEWAY]
                        .map(|process| per_call(TETHER, process))
                        .iter()
                        .sum::<f64>();
                let added = |p: usize| p50(p) as f64 - direct as f64;
                let share = measured[TETHER][s][c].rate() / measured[DIRECT][s][c].rate();
                summary.push(vec![
                    size_label(bytes),
                    concurrency.to_string(),
                    format!("{:+.1} µs", added(1) / 1e3),
                    format!("{:+.1} µs", added(2) / 1e3),
                    match added(1) > 0.0 {
                        true => format!("{:.1}×", added(2) / added(1)),
                        false => "(relay adds nothing)".into(),
                    },
                    format!("{:.0} %", share * 100.0),
                    format!("{:.0} %", cpu_share * 100.0),
                ]);
            }
        }
        table(
            &[
                "result",
                "clients",
                "path",
                "p50",
                "p99",
                "calls/s",
                "added p50",
            ],
            &rows,
        );
        println!();
        table(
            &[
                "result",
                "clients",
                "relay adds (p50)",
                "tether adds (p50)",
                "tether / relay",
                "tether throughput / direct",
                "CPU a call, direct / tether (the share full cores allow)",
            ],
            &summary,
        );
        println!();
        table(
            &[
                "result",
                "clients",
                "path",
                "clients' CPU a call",
                "server's",
                "gateway's",
                "cores busy",
            ],
            &cpu_rows,
        );
        if !memory.is_empty() {
            println!();
            for (one, all) in &memory {
                match transport {
                    "http" => println!(
                        "tether resident memory: {one} kB with 1 client session, {all} kB with {sessions}: {:.0} kB per added session",
                        (*all as f64 - *one as f64) / (sessions.max(2) - 1) as f64
                    ),
                    _ => println!("tether resident memory with its one stdio client: {one} kB"),
                }
            }
        }
        println!();
    }
    Ok(())
}
