//! How a server's task reaches its server: a [`Connector`] opens sessions, a [`Link`] is one
//! open session as supervision sees it (its end, keepalives, list reads, closing). The real ones
//! are MCP sessions over stdio, Streamable HTTP or SSE ([`Upstream`]); tests of supervision
//! logic plug in a fake and run in virtual time.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use tokio::sync::broadcast;

use crate::catalog::ServerCatalog;
use crate::config::{ServerSpec, Timeouts};
use crate::policy::{Fault, Tool, TransportKind};
use crate::upstream::{KeepaliveFailure, ListChanges, Remembered, ServerEvent, Session};

/// What an attempt needs to open a session.
pub struct OpenRequest {
    /// The server.
    pub spec: ServerSpec,
    /// What earlier sessions taught about the server (its HTTP flavor, its generation).
    pub remembered: Remembered,
    /// Where the session reports that the server's lists changed.
    pub changes: Arc<ListChanges>,
    /// Where the session sends resource updates and log messages.
    pub events: broadcast::Sender<ServerEvent>,
    /// Where a stdio server's stderr goes.
    pub log_dir: PathBuf,
    /// Signs an OAuth server's requests.
    pub auth: Option<Arc<crate::auth::Authorizer>>,
}

/// A session that opened, with what it offers.
pub struct Opened {
    /// The session.
    pub link: Arc<dyn Link>,
    /// Its tools.
    pub tools: Vec<Tool>,
    /// Its prompts, resources and templates.
    pub catalog: ServerCatalog,
}

/// An attempt's outcome, and what it taught about the server.
pub type Attempt = BoxFuture<'static, (Result<Opened, Fault>, Remembered)>;

/// Opens sessions.
pub trait Connector: Send + Sync {
    /// Opens a session and lists its tools and catalog; a failure closes what was opened.
    fn open(&self, request: OpenRequest) -> Attempt;
}

/// One open session, as supervision sees it.
pub trait Link: Send + Sync {
    /// The server's name and version, as it said.
    fn server_info(&self) -> String;
    /// The child's process id (stdio).
    fn pid(&self) -> Option<u32>;
    /// How the session reaches the server.
    fn transport(&self) -> TransportKind;
    /// Whether the session has not ended. Once false, `ended` resolves promptly: the
    /// transport that saw the end settles its cause (a stdio child's exit status) itself.
    fn is_alive(&self) -> bool;
    /// Resolves when the session ends, with why.
    fn ended(&self) -> BoxFuture<'_, Fault>;
    /// What the transport recorded against the session, if anything yet (it may still run).
    fn recorded_end(&self) -> Option<Fault>;
    /// Proves the session answers.
    fn keepalive<'a>(
        &'a self,
        timeouts: &'a Timeouts,
    ) -> BoxFuture<'a, Result<(), KeepaliveFailure>>;
    /// Reads the tool list.
    fn list_tools<'a>(&'a self, timeouts: &'a Timeouts) -> BoxFuture<'a, Result<Vec<Tool>, Fault>>;
    /// Reads prompts, resources and templates.
    fn list_catalog<'a>(
        &'a self,
        timeouts: &'a Timeouts,
    ) -> BoxFuture<'a, Result<ServerCatalog, Fault>>;
    /// Closes the session (a child gets `grace` to exit before it is killed).
    fn close(&self, grace: Duration) -> BoxFuture<'_, ()>;
    /// The MCP session for tool calls and the rest of the gateway (none for a fake).
    fn session(self: Arc<Self>) -> Option<Arc<Session>>;
}

/// Real MCP servers over stdio, Streamable HTTP or SSE.
pub struct Upstream;

impl Connector for Upstream {
    fn open(&self, request: OpenRequest) -> Attempt {
        let OpenRequest {
            spec,
            mut remembered,
            changes,
            events,
            log_dir,
            auth,
        } = request;
        async move {
            let result = async {
                let session =
                    Session::open(&spec, &mut remembered, changes, events, &log_dir, auth).await?;
                let listed = async {
                    let tools = session.list_tools(&spec.timeouts).await?;
                    let catalog = session.list_catalog(&spec.timeouts).await?;
                    Ok((tools, catalog))
                };
                match listed.await {
                    Ok((tools, catalog)) => Ok(Opened {
                        link: Arc::new(session),
                        tools,
                        catalog,
                    }),
                    Err(fault) => {
                        session.close(spec.timeouts.stop_grace).await;
                        Err(fault)
                    }
                }
            }
            .await;
            if result.is_err() {
                // The server may have been replaced by one of another generation: probe again.
                remembered.generation = None;
            }
            (result, remembered)
        }
        .boxed()
    }
}

impl Link for Session {
    fn server_info(&self) -> String {
        Session::server_info(self).to_string()
    }
    fn pid(&self) -> Option<u32> {
        Session::pid(self)
    }
    fn transport(&self) -> TransportKind {
        Session::transport(self)
    }
    fn is_alive(&self) -> bool {
        Session::is_alive(self)
    }
    fn ended(&self) -> BoxFuture<'_, Fault> {
        Session::ended(self).boxed()
    }
    fn recorded_end(&self) -> Option<Fault> {
        Session::recorded_end(self)
    }
    fn keepalive<'a>(
        &'a self,
        timeouts: &'a Timeouts,
    ) -> BoxFuture<'a, Result<(), KeepaliveFailure>> {
        Session::keepalive(self, timeouts).boxed()
    }
    fn list_tools<'a>(&'a self, timeouts: &'a Timeouts) -> BoxFuture<'a, Result<Vec<Tool>, Fault>> {
        Session::list_tools(self, timeouts).boxed()
    }
    fn list_catalog<'a>(
        &'a self,
        timeouts: &'a Timeouts,
    ) -> BoxFuture<'a, Result<ServerCatalog, Fault>> {
        Session::list_catalog(self, timeouts).boxed()
    }
    fn close(&self, grace: Duration) -> BoxFuture<'_, ()> {
        Session::close(self, grace).boxed()
    }
    fn session(self: Arc<Self>) -> Option<Arc<Session>> {
        Some(self)
    }
}
