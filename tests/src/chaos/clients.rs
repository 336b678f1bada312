//! Agents on the gateway: rmcp clients over Streamable HTTP, each with a few lanes calling the
//! tools it currently sees, every call carrying a unique id, every answer classified.

use crate::text;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, Peer, RoleClient, ServiceError, ServiceExt};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::rng::Rng;

/// The fixture tools the clients call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ToolKind {
    /// Not idempotent, not read-only: must never run twice for one call.
    SideEffect,
    /// Not annotated read-only either.
    Echo,
    /// Read-only: Tether may retry it once on a fresh session.
    Add,
}

impl ToolKind {
    pub const ALL: [ToolKind; 3] = [ToolKind::SideEffect, ToolKind::Echo, ToolKind::Add];

    pub fn name(self) -> &'static str {
        match self {
            ToolKind::SideEffect => "side_effect",
            ToolKind::Echo => "echo",
            ToolKind::Add => "add",
        }
    }

    pub fn from_name(name: &str) -> Option<ToolKind> {
        ToolKind::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn read_only(self) -> bool {
        self == ToolKind::Add
    }

    /// The arguments of call `id`; each carries the id, so `calls.log` names the call.
    pub fn arguments(self, id: u64) -> JsonObject {
        let value = match self {
            ToolKind::SideEffect => serde_json::json!({"label": label(id)}),
            ToolKind::Echo => serde_json::json!({"text": label(id)}),
            ToolKind::Add => serde_json::json!({"a": id, "b": 1}),
        };
        value.as_object().cloned().unwrap_or_default()
    }

    /// The text of a correct answer to call `id`.
    pub fn expected(self, id: u64) -> String {
        match self {
            ToolKind::SideEffect => "done".into(),
            ToolKind::Echo => label(id),
            ToolKind::Add => (id + 1).to_string(),
        }
    }

    /// The call id in the arguments of a `calls.log` line of this tool.
    pub fn id_in(self, arguments: &serde_json::Value) -> Option<u64> {
        match self {
            ToolKind::SideEffect => unlabel(arguments.get("label")?.as_str()?),
            ToolKind::Echo => unlabel(arguments.get("text")?.as_str()?),
            ToolKind::Add => arguments.get("a")?.as_u64(),
        }
    }

    /// Relative weight of the tool in the clients' choices.
    fn weight(self) -> u32 {
        match self {
            ToolKind::SideEffect => 5,
            ToolKind::Echo => 3,
            ToolKind::Add => 2,
        }
    }
}

fn label(id: u64) -> String {
    format!("chaos-{id}")
}

fn unlabel(label: &str) -> Option<u64> {
    label.strip_prefix("chaos-")?.parse().ok()
}

/// Why Tether did not send a call, from its words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NotSent {
    Reconnecting,
    CircuitOpen,
    CircuitHalfOpen,
    Parked,
    ShuttingDown,
    Other,
}

/// How one call ended, as the agent saw it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// The right answer.
    Ok,
    /// Refused: "the call was not sent".
    NotSent(NotSent),
    /// "did not answer within N s ... the outcome is uncertain".
    TimedOut,
    /// "The connection to server ... was lost": the outcome is uncertain.
    Lost,
    /// The server rejected the call (a JSON-RPC error).
    Rejected,
    /// The answer was larger than `max_message`.
    TooLarge,
    /// The gateway no longer lists the tool (the client's list was stale).
    UnknownTool,
    // What follows is a failure of the soak's checks.
    /// A success whose text is not the call's answer.
    WrongAnswer(String),
    /// An error whose text is none of Tether's messages, or does not name the server.
    Unclear(String),
    /// The MCP request to the gateway itself failed.
    ClientError(String),
    /// No answer at all before the client gave up.
    Hung,
}

impl Outcome {
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            Outcome::WrongAnswer(_) | Outcome::Unclear(_) | Outcome::ClientError(_) | Outcome::Hung
        )
    }

    /// The row this outcome is counted in.
    pub fn row(&self) -> &'static str {
        match self {
            Outcome::Ok => "answered ok",
            Outcome::NotSent(NotSent::Reconnecting) => "refused, not sent: reconnecting",
            Outcome::NotSent(NotSent::CircuitOpen) => "refused, not sent: circuit open",
            Outcome::NotSent(NotSent::CircuitHalfOpen) => "refused, not sent: circuit half-open",
            Outcome::NotSent(NotSent::Parked) => "refused, not sent: parked",
            Outcome::NotSent(NotSent::ShuttingDown) => "refused, not sent: shutting down",
            Outcome::NotSent(NotSent::Other) => "refused, not sent: other",
            Outcome::TimedOut => "timed out (outcome uncertain)",
            Outcome::Lost => "connection lost in flight (outcome uncertain)",
            Outcome::Rejected => "rejected by the server",
            Outcome::TooLarge => "answer too large",
            Outcome::UnknownTool => "unknown tool (withdrawn before the call)",
            Outcome::WrongAnswer(_) => "FAIL: wrong answer",
            Outcome::Unclear(_) => "FAIL: unclear message",
            Outcome::ClientError(_) => "FAIL: MCP error from the gateway",
            Outcome::Hung => "FAIL: hung (no answer)",
        }
    }
}

/// Classifies the gateway's answer to a call of `server`'s tool expecting `expected`.
pub fn classify(
    answer: Result<CallToolResult, ServiceError>,
    server: &str,
    expected: &str,
) -> Outcome {
    match answer {
        Ok(result) if result.is_error != Some(true) => {
            let text = text(&result);
            if text == expected {
                Outcome::Ok
            } else {
                Outcome::WrongAnswer(text)
            }
        }
        Ok(result) => classify_refusal(&text(&result), server),
        Err(ServiceError::McpError(error))
            if error.message.contains("unknown tool") && error.message.contains("tools/list") =>
        {
            Outcome::UnknownTool
        }
        Err(error) => Outcome::ClientError(error.to_string()),
    }
}

/// Tether's words for a call it refused or could not complete. Every one names the server
/// and says whether the call was sent.
pub fn classify_refusal(text: &str, server: &str) -> Outcome {
    if !text.contains(&format!("\"{server}\"")) {
        return Outcome::Unclear(text.to_string());
    }
    if text.contains("the call was not sent") {
        let why = if text.contains("is reconnecting") || text.contains("is connecting") {
            NotSent::Reconnecting
        } else if text.contains("circuit open") {
            NotSent::CircuitOpen
        } else if text.contains("circuit half-open") {
            NotSent::CircuitHalfOpen
        } else if text.contains("is unavailable") {
            NotSent::Parked
        } else if text.contains("shutting down") {
            NotSent::ShuttingDown
        } else {
            NotSent::Other
        };
        return Outcome::NotSent(why);
    }
    if text.contains("did not answer within") && text.contains("uncertain") {
        Outcome::TimedOut
    } else if text.contains("was lost") {
        Outcome::Lost
    } else if text.contains("rejected the call") {
        Outcome::Rejected
    } else if text.contains("larger than Tether's limit") {
        Outcome::TooLarge
    } else {
        Outcome::Unclear(text.to_string())
    }
}

/// One call as the agent saw it.
#[derive(Clone, Debug)]
pub struct CallRecord {
    pub id: u64,
    /// The client, or `None` for the soak's own verification calls.
    pub client: Option<usize>,
    pub server: String,
    pub tool: ToolKind,
    /// When the call started, from the start of the chaos.
    pub started: Duration,
    pub latency: Duration,
    pub outcome: Outcome,
}

/// What every client shares.
pub struct Calls {
    next_id: AtomicU64,
    pub records: Mutex<Vec<CallRecord>>,
    /// Failed or hung `tools/list` requests to the gateway.
    pub list_failures: Mutex<Vec<String>>,
    t0: Instant,
    /// How long a client waits for an answer before it counts the call as hung.
    give_up: Duration,
}

impl Calls {
    pub fn new(t0: Instant, give_up: Duration) -> Calls {
        Calls {
            next_id: AtomicU64::new(0),
            records: Mutex::new(Vec::new()),
            list_failures: Mutex::new(Vec::new()),
            t0,
            give_up,
        }
    }

    /// Calls `server`'s `tool` (advertised as `advertised`) once with a fresh id and records
    /// how it ended.
    pub async fn call(
        &self,
        peer: &Peer<RoleClient>,
        client: Option<usize>,
        server: &str,
        tool: ToolKind,
        advertised: &str,
    ) -> Outcome {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst) + 1;
        let params =
            CallToolRequestParams::new(advertised.to_string()).with_arguments(tool.arguments(id));
        let start = Instant::now();
        let answer = tokio::time::timeout(self.give_up, peer.call_tool(params)).await;
        let latency = start.elapsed();
        let outcome = match answer {
            Ok(answer) => classify(answer, server, &tool.expected(id)),
            Err(_) => Outcome::Hung,
        };
        self.records.lock().unwrap().push(CallRecord {
            id,
            client,
            server: server.to_string(),
            tool,
            started: start.duration_since(self.t0),
            latency,
            outcome: outcome.clone(),
        });
        outcome
    }

    pub fn count(&self) -> usize {
        self.records.lock().unwrap().len()
    }
}

/// A client that notes `notifications/tools/list_changed`.
#[derive(Clone, Default)]
pub struct Agent {
    changed: Arc<AtomicBool>,
}

impl ClientHandler for Agent {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changed.store(true, Ordering::SeqCst);
    }
}

/// An MCP session with the gateway.
pub async fn connect(url: &str) -> anyhow::Result<(RunningService<RoleClient, Agent>, Agent)> {
    let agent = Agent::default();
    let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.to_string());
    let service = tokio::time::timeout(Duration::from_secs(30), agent.clone().serve(transport))
        .await
        .map_err(|_| anyhow::anyhow!("MCP handshake with the gateway timed out"))??;
    Ok((service, agent))
}

/// A tool the gateway lists: its server, its kind and its advertised name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Listed {
    pub server: String,
    pub tool: ToolKind,
    pub advertised: String,
}

/// The gateway's tools/list, split into `<server>__<tool>`.
pub async fn list(peer: &Peer<RoleClient>) -> Result<Vec<String>, String> {
    match tokio::time::timeout(Duration::from_secs(15), peer.list_all_tools()).await {
        Ok(Ok(tools)) => Ok(tools.into_iter().map(|t| t.name.into_owned()).collect()),
        Ok(Err(error)) => Err(format!("tools/list failed: {error}")),
        Err(_) => Err("tools/list got no answer within 15 s".into()),
    }
}

pub fn parse_listed(names: &[String]) -> Vec<Listed> {
    names
        .iter()
        .filter_map(|name| {
            let (server, tool) = name.split_once("__")?;
            Some(Listed {
                server: server.to_string(),
                tool: ToolKind::from_name(tool)?,
                advertised: name.clone(),
            })
        })
        .collect()
}

/// The running clients.
pub struct Clients {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
    services: Vec<RunningService<RoleClient, Agent>>,
}

/// Think time between two calls of a lane.
const THINK_MS: (u64, u64) = (2, 20);
/// Most calls one client has in flight to one server: a hung server holds a few lanes, not
/// all of them, so the other servers keep being called meanwhile.
const PER_SERVER: usize = 1;

/// A client's calls in flight, by server.
type Busy = Arc<Mutex<HashMap<String, usize>>>;

impl Clients {
    /// `clients` sessions with `lanes` concurrent callers each.
    pub async fn start(
        url: &str,
        clients: usize,
        lanes: usize,
        seed: u64,
        calls: Arc<Calls>,
    ) -> anyhow::Result<Clients> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        let mut services = Vec::new();
        for client in 0..clients {
            let (service, agent) = connect(url).await?;
            let peer = service.peer().clone();
            let tools: Arc<RwLock<Vec<Listed>>> = Arc::default();
            let busy: Busy = Arc::default();
            tasks.push(tokio::spawn(refresh(
                peer.clone(),
                agent,
                tools.clone(),
                stop.clone(),
                calls.clone(),
            )));
            for lane in 0..lanes {
                let rng = Rng::fork(seed ^ 0x00c1_1e47, (client * 1000 + lane) as u64);
                tasks.push(tokio::spawn(call_loop(
                    peer.clone(),
                    client,
                    tools.clone(),
                    busy.clone(),
                    stop.clone(),
                    calls.clone(),
                    rng,
                )));
            }
            services.push(service);
        }
        Ok(Clients {
            stop,
            tasks,
            services,
        })
    }

    /// Stops calling, waits for every call in flight to end (each is bounded by the
    /// client's give-up time), and closes the sessions.
    pub async fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            let _ = task.await;
        }
        for service in self.services {
            let _ = service.cancel().await;
        }
    }
}

/// Keeps a client's view of the tools current: on `list_changed`, and at least every second.
async fn refresh(
    peer: Peer<RoleClient>,
    agent: Agent,
    tools: Arc<RwLock<Vec<Listed>>>,
    stop: Arc<AtomicBool>,
    calls: Arc<Calls>,
) {
    let mut last = Instant::now() - Duration::from_secs(10);
    while !stop.load(Ordering::SeqCst) {
        if agent.changed.swap(false, Ordering::SeqCst) || last.elapsed() > Duration::from_secs(1) {
            last = Instant::now();
            match list(&peer).await {
                Ok(names) => *tools.write().unwrap() = parse_listed(&names),
                Err(error) => calls.list_failures.lock().unwrap().push(error),
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One lane: picks a listed server (one this client has not [`PER_SERVER`] calls in flight to),
/// then one of its tools, calls it, thinks, repeats.
async fn call_loop(
    peer: Peer<RoleClient>,
    client: usize,
    tools: Arc<RwLock<Vec<Listed>>>,
    busy: Busy,
    stop: Arc<AtomicBool>,
    calls: Arc<Calls>,
    mut rng: Rng,
) {
    while !stop.load(Ordering::SeqCst) {
        let pick = {
            let tools = tools.read().unwrap();
            let mut busy = busy.lock().unwrap();
            let servers: BTreeSet<&str> = tools
                .iter()
                .map(|t| t.server.as_str())
                .filter(|s| busy.get(*s).copied().unwrap_or(0) < PER_SERVER)
                .collect();
            if servers.is_empty() {
                None
            } else {
                let server = *servers
                    .iter()
                    .nth(rng.below(servers.len() as u64) as usize)
                    .expect("in range");
                let offered: Vec<&Listed> = tools.iter().filter(|t| t.server == server).collect();
                let weights: Vec<u32> = offered.iter().map(|t| t.tool.weight()).collect();
                *busy.entry(server.to_string()).or_default() += 1;
                Some(offered[rng.weighted(&weights)].clone())
            }
        };
        match pick {
            Some(listed) => {
                calls
                    .call(
                        &peer,
                        Some(client),
                        &listed.server,
                        listed.tool,
                        &listed.advertised,
                    )
                    .await;
                if let Some(n) = busy.lock().unwrap().get_mut(&listed.server) {
                    *n -= 1;
                }
                tokio::time::sleep(rng.millis(THINK_MS.0, THINK_MS.1)).await;
            }
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tether_messages_are_classified_and_others_are_unclear() {
        let s = "files";
        let cases = [
            (
                "Server \"files\" is reconnecting after its process was killed by a signal; the call was not sent. Wait about 1 s and retry.",
                Outcome::NotSent(NotSent::Reconnecting),
            ),
            (
                "Server \"files\" is failing (circuit open after 3 consecutive transport failures); the call was not sent. Wait about 2 s and retry.",
                Outcome::NotSent(NotSent::CircuitOpen),
            ),
            (
                "Server \"files\" did not answer within 2 s. The call reached the server and may still be running: the outcome is uncertain. Do not retry it blindly; check its effect first.",
                Outcome::TimedOut,
            ),
            (
                "The connection to server \"files\" was lost while the call was in flight (its process was killed). The call may or may not have run: the outcome is uncertain.",
                Outcome::Lost,
            ),
            (
                "something broke",
                Outcome::Unclear("something broke".into()),
            ),
            (
                "Server \"other\" is connecting; the call was not sent.",
                Outcome::Unclear("Server \"other\" is connecting; the call was not sent.".into()),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(classify_refusal(text, s), want, "{text}");
        }
    }

    #[test]
    fn call_ids_survive_the_round_trip_through_calls_log() {
        for tool in ToolKind::ALL {
            let args = serde_json::Value::Object(tool.arguments(42));
            assert_eq!(tool.id_in(&args), Some(42), "{tool:?}");
        }
        assert_eq!(ToolKind::Add.expected(41), "42");
    }
}
