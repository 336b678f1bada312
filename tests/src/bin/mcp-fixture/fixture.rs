//! Process-wide fixture state shared by every session: settings (flags + `control.json`),
//! counters, armed exits and the live peers to tell about tool-list changes.

#![allow(deprecated)] // logging: the fixture plays a server of the older generation

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use rmcp::{
    Peer, RoleServer,
    model::{
        LoggingLevel, LoggingMessageNotificationParam, ResourceUpdatedNotificationParam,
        SubscriptionFilter,
    },
    service::SubscriptionSink,
};
use serde_json::{Map, Value};

use crate::severity::severity;
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
    /// `tools/call` POSTs seen, for `http_fail_calls`.
    posted_calls: AtomicU64,
    /// `ping` POSTs seen, for `http_fail_pings`.
    posted_pings: AtomicU64,
    exit_armed: AtomicBool,
    peers: Mutex<Vec<Peer<RoleServer>>>,
    /// Sessions subscribed to a resource URI.
    subscribers: Mutex<Vec<(Peer<RoleServer>, String)>>,
    /// 2026-07-28 `subscriptions/listen` streams, with what each accepted.
    streams: Mutex<Vec<(u64, SubscriptionSink, SubscriptionFilter)>>,
    next_stream: AtomicU64,
    /// The least severe log message sent (`logging/setLevel`), for every session.
    log_level: Mutex<LoggingLevel>,
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
            posted_calls: AtomicU64::new(0),
            posted_pings: AtomicU64::new(0),
            exit_armed: AtomicBool::new(false),
            peers: Mutex::new(Vec::new()),
            subscribers: Mutex::new(Vec::new()),
            streams: Mutex::new(Vec::new()),
            next_stream: AtomicU64::new(0),
            log_level: Mutex::new(LoggingLevel::Info),
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

    /// The status a `tools/call` POST is failed with instead of run, when `http_fail_calls`
    /// says this one fails.
    pub fn fails_posted_call(&self, settings: &Behaviour) -> Option<u16> {
        let seen = self.posted_calls.fetch_add(1, Ordering::SeqCst);
        (seen < settings.http_fail_calls).then(|| settings.http_fail_status.unwrap_or(500))
    }

    /// The status a `ping` POST is failed with, when `http_fail_pings` says this one fails.
    pub fn fails_posted_ping(&self, settings: &Behaviour) -> Option<u16> {
        let seen = self.posted_pings.fetch_add(1, Ordering::SeqCst);
        (seen < settings.http_fail_pings).then(|| settings.http_fail_status.unwrap_or(500))
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

    /// A `subscriptions/listen` stream opened; its resource URIs are recorded in
    /// `subscriptions.log` as subscriptions.
    pub fn add_stream(&self, sink: SubscriptionSink, accepted: SubscriptionFilter) -> u64 {
        for uri in accepted.resource_subscriptions.iter().flatten() {
            self.record_subscription("subscribe", uri);
        }
        let id = self.next_stream.fetch_add(1, Ordering::SeqCst);
        self.streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id, sink, accepted));
        id
    }

    pub fn remove_stream(&self, id: u64) {
        self.streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(stream, _, _)| *stream != id);
    }

    /// Sends to every stream whose filter `wants` the notification.
    fn notify_streams<F, Fut>(&self, wants: impl Fn(&SubscriptionFilter) -> bool, notify: F)
    where
        F: Fn(SubscriptionSink) -> Fut,
        Fut: std::future::Future<Output = Result<(), rmcp::service::SubscriptionSendError>>
            + Send
            + 'static,
    {
        let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        for (_, sink, accepted) in streams.iter() {
            if wants(accepted) {
                let sent = notify(sink.clone());
                tokio::spawn(async move {
                    if let Err(error) = sent.await {
                        eprintln!("mcp-fixture: notifying a stream: {error}");
                    }
                });
            }
        }
    }

    /// `resources/subscribe` from `peer`; recorded in `subscriptions.log`.
    pub fn subscribe(&self, peer: Peer<RoleServer>, uri: &str) {
        self.record_subscription("subscribe", uri);
        self.subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((peer, uri.to_string()));
    }

    pub fn unsubscribe(&self, uri: &str) {
        self.record_subscription("unsubscribe", uri);
        self.subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(_, subscribed)| subscribed != uri);
    }

    /// `logging/setLevel`; recorded in `logging.log`.
    pub fn set_log_level(&self, level: LoggingLevel) {
        *self.log_level.lock().unwrap_or_else(|e| e.into_inner()) = level;
        let name = serde_json::to_value(level).unwrap_or_default();
        let line = format!("setLevel {}", name.as_str().unwrap_or_default());
        if let Err(error) = self.state.append_line(state::LOGGING_LOG, &line) {
            eprintln!("mcp-fixture: recording a log level: {error}");
        }
    }

    /// Sends `message` at `level` to every session, if the level set lets it through.
    #[allow(deprecated)]
    fn log(&self, level: LoggingLevel, message: &str) {
        let set = *self.log_level.lock().unwrap_or_else(|e| e.into_inner());
        if severity(level) < severity(set) {
            return;
        }
        let log = LoggingMessageNotificationParam::new(level, Value::String(message.to_string()));
        self.notify_peers(move |peer| {
            let log = log.clone();
            async move { peer.notify_logging_message(log).await }
        });
    }

    fn record_subscription(&self, what: &str, uri: &str) {
        if let Err(error) = self
            .state
            .append_line(state::SUBSCRIPTIONS_LOG, &format!("{what} {uri}"))
        {
            eprintln!("mcp-fixture: recording a subscription: {error}");
        }
    }

    /// Polls `control.json`: applies `crash_after_ms`, announces list changes, sends resource
    /// updates and log messages added to `updated` and `logs`.
    pub async fn watch_control(self: Arc<Self>) {
        let start = self.settings();
        let mut advertised = tools::advertised(&start);
        let mut prompts = start.prompts.clone();
        let mut resources = (start.resources.clone(), start.templates.clone());
        let mut updated = start.updated.clone().unwrap_or_default().len();
        let mut logs = start.logs.clone().unwrap_or_default().len();
        let mut debug_logs = start.debug_logs.clone().unwrap_or_default().len();
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
            if settings.prompts != prompts {
                prompts = settings.prompts.clone();
                self.notify_peers(|peer| async move { peer.notify_prompt_list_changed().await });
                self.notify_streams(
                    |f| f.prompts_list_changed == Some(true),
                    |sink| async move { sink.notify_prompt_list_changed().await },
                );
            }
            let now = (settings.resources.clone(), settings.templates.clone());
            if now != resources {
                resources = now;
                self.notify_peers(|peer| async move { peer.notify_resource_list_changed().await });
                self.notify_streams(
                    |f| f.resources_list_changed == Some(true),
                    |sink| async move { sink.notify_resource_list_changed().await },
                );
            }
            let all_updated = settings.updated.clone().unwrap_or_default();
            for uri in all_updated.iter().skip(updated) {
                self.notify_updated(uri);
            }
            updated = all_updated.len();
            let all_logs = settings.logs.clone().unwrap_or_default();
            for message in all_logs.iter().skip(logs) {
                self.log(LoggingLevel::Warning, message);
            }
            logs = all_logs.len();
            let all_debug_logs = settings.debug_logs.clone().unwrap_or_default();
            for message in all_debug_logs.iter().skip(debug_logs) {
                self.log(LoggingLevel::Debug, message);
            }
            debug_logs = all_debug_logs.len();
        }
    }

    fn notify_updated(&self, uri: &str) {
        let wanted = uri.to_string();
        let sent = wanted.clone();
        self.notify_streams(
            move |f| {
                f.resource_subscriptions
                    .as_ref()
                    .is_some_and(|uris| uris.contains(&wanted))
            },
            move |sink| {
                let uri = sent.clone();
                async move { sink.notify_resource_updated(uri).await }
            },
        );
        let subscribers = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        for (peer, _) in subscribers
            .iter()
            .filter(|(_, subscribed)| subscribed == uri)
        {
            let (peer, uri) = (peer.clone(), uri.to_string());
            tokio::spawn(async move {
                let update = ResourceUpdatedNotificationParam::new(uri);
                if let Err(error) = peer.notify_resource_updated(update).await {
                    eprintln!("mcp-fixture: notifying resources/updated: {error}");
                }
            });
        }
    }

    fn notify_peers<F, Fut>(&self, notify: F)
    where
        F: Fn(Peer<RoleServer>) -> Fut,
        Fut: std::future::Future<Output = Result<(), rmcp::service::ServiceError>> + Send + 'static,
    {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.retain(|peer| !peer.is_transport_closed());
        for peer in peers.clone() {
            // One task per peer: a stalled session must not delay the others.
            let sent = notify(peer);
            tokio::spawn(async move {
                if let Err(error) = sent.await {
                    eprintln!("mcp-fixture: notifying a session: {error}");
                }
            });
        }
    }

    fn notify_tools_changed(&self) {
        self.notify_streams(
            |f| f.tools_list_changed == Some(true),
            |sink| async move { sink.notify_tool_list_changed().await },
        );
        self.notify_peers(|peer| async move { peer.notify_tool_list_changed().await });
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
