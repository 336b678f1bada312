//! Process-wide fixture state shared by every session: settings (flags + `control.json`),
//! counters, armed exits and the live peers to tell about tool-list changes.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use rmcp::{Peer, RoleServer};
use serde_json::{Map, Value};

use crate::{
    cli::{Behaviour, Transport, exit_code},
    state::{self, StateDir},
    tools,
};

/// How often `control.json` is polled (tool-list changes, `crash_after_ms`).
const CONTROL_POLL: Duration = Duration::from_millis(50);
/// Time for an answer to reach the client before an armed exit; calls arriving meanwhile
/// are held, so nothing executes after the answer that triggered the exit.
const ANSWER_GRACE: Duration = Duration::from_millis(200);

pub struct Fixture {
    pub state: StateDir,
    pub transport: Transport,
    cli: Behaviour,
    control: Mutex<ControlCache>,
    started: Instant,
    calls: AtomicU64,
    exit_armed: AtomicBool,
    peers: Mutex<Vec<Peer<RoleServer>>>,
}

/// The last `control.json` that parsed; a torn or invalid file keeps it in force.
#[derive(Default)]
struct ControlCache {
    good: Map<String, Value>,
    // The rejected text, so a bad file is reported once rather than on every poll.
    bad_text: Option<String>,
}

/// Logs why, then ends the process at once with `code` (no destructors, no goodbyes:
/// this is how the fixture crashes).
pub fn exit(code: i32, why: &str) -> ! {
    eprintln!("mcp-fixture[{}]: exit {code}: {why}", std::process::id());
    std::process::exit(code)
}

impl Fixture {
    /// Records the start (`starts`, `pid`) and returns the fixture.
    pub fn start(state: StateDir, cli: Behaviour, transport: Transport) -> std::io::Result<Self> {
        state.bump(state::STARTS)?;
        state.write_pid()?;
        Ok(Self {
            state,
            transport,
            cli,
            control: Mutex::new(ControlCache::default()),
            started: Instant::now(),
            calls: AtomicU64::new(0),
            exit_armed: AtomicBool::new(false),
            peers: Mutex::new(Vec::new()),
        })
    }

    /// The flags with the current `control.json` laid over them (re-read on every call).
    pub fn settings(&self) -> Behaviour {
        let mut cache = self.control.lock().unwrap_or_else(|e| e.into_inner());
        match self.state.read_control() {
            Ok(None) => {
                cache.good.clear();
                cache.bad_text = None;
            }
            Ok(Some(text)) => match parse_control(&self.cli, &text) {
                Ok((map, settings)) => {
                    cache.good = map;
                    cache.bad_text = None;
                    return settings;
                }
                Err(error) => {
                    if cache.bad_text.as_deref() != Some(text.as_str()) {
                        eprintln!(
                            "mcp-fixture: ignoring control.json ({error}); keeping the last good one"
                        );
                        cache.bad_text = Some(text);
                    }
                }
            },
            Err(error) => eprintln!("mcp-fixture: reading control.json: {error}"),
        }
        self.cli
            .overlaid(&cache.good)
            .unwrap_or_else(|_| self.cli.clone())
    }

    /// Counts an `initialize` request; false when `fail_initializes` says this one fails.
    pub fn record_initialize(&self) -> bool {
        let count = match self.state.bump(state::INITIALIZES) {
            Ok(count) => count,
            Err(error) => {
                eprintln!("mcp-fixture: counting initializes: {error}");
                return true;
            }
        };
        count > self.settings().fail_initializes
    }

    /// Numbers an executed call (1 for this process's first).
    pub fn next_call_number(&self) -> u64 {
        self.calls.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Whether an exit is pending; calls then wait for it instead of executing.
    pub fn exit_armed(&self) -> bool {
        self.exit_armed.load(Ordering::SeqCst)
    }

    /// Exits with `code` shortly, leaving time for the answer being sent now to arrive.
    pub fn exit_after_answer(&self, code: i32, why: &'static str) {
        if !self.exit_armed.swap(true, Ordering::SeqCst) {
            tokio::spawn(async move {
                tokio::time::sleep(ANSWER_GRACE).await;
                exit(code, why);
            });
        }
    }

    /// Remembers a session's peer, to tell it when the tool list changes.
    pub fn register_peer(&self, peer: Peer<RoleServer>) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.retain(|peer| !peer.is_transport_closed());
        peers.push(peer);
    }

    /// Polls `control.json`: applies `crash_after_ms` and announces tool-list changes.
    pub async fn watch_control(self: Arc<Self>) {
        let mut advertised = tools::advertised(&self.settings());
        let mut tick = tokio::time::interval(CONTROL_POLL);
        loop {
            tick.tick().await;
            let settings = self.settings();
            if let Some(ms) = settings.crash_after_ms
                && self.started.elapsed() >= Duration::from_millis(ms)
            {
                exit(exit_code::CRASH_AFTER_MS, "crash after ms");
            }
            let now = tools::advertised(&settings);
            if now != advertised {
                advertised = now;
                self.notify_tools_changed();
            }
        }
    }

    fn notify_tools_changed(&self) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.retain(|peer| !peer.is_transport_closed());
        for peer in peers.clone() {
            // One task per peer: a stalled session must not delay the others.
            tokio::spawn(async move {
                if let Err(error) = peer.notify_tool_list_changed().await {
                    eprintln!("mcp-fixture: notifying tools/list_changed: {error}");
                }
            });
        }
    }
}

fn parse_control(cli: &Behaviour, text: &str) -> Result<(Map<String, Value>, Behaviour), String> {
    match serde_json::from_str::<Value>(text).map_err(|e| e.to_string())? {
        Value::Object(map) => {
            let settings = cli.overlaid(&map)?;
            Ok((map, settings))
        }
        _ => Err("not a JSON object".to_owned()),
    }
}
