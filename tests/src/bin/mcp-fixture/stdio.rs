//! MCP over stdin/stdout (newline-delimited JSON-RPC) with rmcp's stdio transport.

use std::sync::Arc;

use rmcp::{ServiceExt, service::ServerInitializeError};

use crate::{fixture::Fixture, handler::Handler};

/// Serves one session until stdin closes.
pub async fn serve(fixture: Arc<Fixture>) -> Result<(), String> {
    let fixture_is_stubborn = fixture.settings().stubborn;
    let running = match Handler::new(fixture).serve(rmcp::transport::stdio()).await {
        Ok(running) => running,
        // The client went away before initializing: a clean end, not a failure.
        Err(ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
        Err(error) => return Err(format!("stdio handshake: {error}")),
    };
    running
        .waiting()
        .await
        .map_err(|error| format!("stdio session: {error}"))?;
    if fixture_is_stubborn {
        // A server that does not notice its client left: only SIGKILL ends it.
        std::future::pending::<()>().await;
    }
    Ok(())
}
