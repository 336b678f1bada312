//! Tether embedded in a small program: servers from a config file plus one from code, an
//! observer that prints what happens, the MCP endpoint mounted in the program's own axum router
//! beside a route of its own, and an orderly shutdown on Ctrl-C.
//!
//! ```sh
//! cargo build -q -p tether-tests --bin mcp-fixture
//! cargo run -q -p tether --example embed -- examples/demo.json 127.0.0.1:8766
//! ```

use std::time::Duration;

use tether::config::ServerSpec;
use tether::{Event, Tether};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info,rmcp=warn"))
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let config = args.next().unwrap_or_else(|| "examples/demo.json".into());
    let bind = args.next().unwrap_or_else(|| "127.0.0.1:8766".into());

    let tether = Tether::builder()
        .config_file(&config)
        // A server from code: `npx` must be installed for it to come up; until then Tether
        // keeps trying (and then parks it), and nothing of it is shown to agents.
        .server(ServerSpec::stdio(
            "everything",
            "npx",
            &["-y", "@modelcontextprotocol/server-everything"],
        ))
        .log_dir(std::env::temp_dir().join("tether-embed-logs"))
        .observer(|event| match event {
            Event::Lifecycle(change) => {
                println!("{}: {:?} - {}", change.server, change.state, change.detail)
            }
            Event::Tools(change) => println!(
                "{}: tools +{:?} -{:?}",
                change.server, change.added, change.removed
            ),
            Event::Policy { notice } => println!("policy: {notice:?}"),
            Event::Lagged { missed } => println!("(missed {missed} events)"),
            _ => {}
        })
        .start()
        .await?;

    // The program's own routes, with Tether's MCP endpoint at /mcp.
    let app = axum::Router::new()
        .route("/health", axum::routing::get(|| async { "ok" }))
        .merge(tether.http_router(Default::default()));
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    println!("MCP at http://{}/mcp", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app.into_make_service()).await });

    for server in tether.status().await.servers {
        println!(
            "{} ({:?}): {:?}",
            server.name, server.transport, server.state
        );
    }
    tokio::signal::ctrl_c().await?;
    // Calls in flight get 10 s; then every server stops and every child is reaped.
    tether.shutdown(Duration::from_secs(10)).await;
    server.abort();
    Ok(())
}
