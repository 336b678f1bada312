//! Process-wide state: the catalog, what the trigger tools changed, who hears about changes.
//!
//! rmcp builds one handler per session and, on the 2026-07-28 wire, one per request, so
//! whatever must outlive a request (the toggled lists, the watched resource, subscribers)
//! lives here, shared by all of them.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use rmcp::{
    RoleServer,
    model::{Prompt, ResourceUpdatedNotificationParam, Tool},
    service::{Peer, SubscriptionSendError, SubscriptionSink},
};
use tokio::sync::Notify;

use crate::{
    catalog::{Catalog, WATCHED_RESOURCE},
    media,
    mrtr::Sealer,
};

/// Which list a trigger tool changed.
#[derive(Clone, Copy, Debug)]
pub enum ListChange {
    Tools,
    Prompts,
}

pub struct Shared {
    pub catalog: Catalog,
    pub sealer: Sealer,
    pub png: String,
    pub wav: String,
    pub reconnections: Reconnections,
    dynamic_tool: AtomicBool,
    dynamic_prompt: AtomicBool,
    watched_version: AtomicU64,
    next_id: AtomicU64,
    /// 2025-11-25 sessions that finished initializing, by handler id: they get list_changed
    /// and, for the URIs they subscribed to, resources/updated.
    sessions: Mutex<HashMap<u64, Session>>,
    /// Open 2026-07-28 `subscriptions/listen` streams, by handler id.
    listeners: Mutex<HashMap<u64, SubscriptionSink>>,
}

struct Session {
    peer: Peer<RoleServer>,
    subscriptions: HashSet<String>,
}

impl Shared {
    pub fn new() -> Result<Self, String> {
        Ok(Shared {
            catalog: Catalog::new()?,
            sealer: Sealer::new()?,
            png: media::png_base64(),
            wav: media::wav_base64(),
            reconnections: Reconnections::default(),
            dynamic_tool: AtomicBool::new(false),
            dynamic_prompt: AtomicBool::new(false),
            watched_version: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            sessions: Mutex::new(HashMap::new()),
            listeners: Mutex::new(HashMap::new()),
        })
    }

    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn tools(&self) -> Vec<Tool> {
        let mut tools = self.catalog.tools.clone();
        if self.dynamic_tool.load(Ordering::SeqCst) {
            tools.push(self.catalog.dynamic_tool.clone());
        }
        tools
    }

    pub fn has_tool(&self, name: &str) -> bool {
        self.tools().iter().any(|tool| tool.name == name)
    }

    pub fn prompts(&self) -> Vec<Prompt> {
        let mut prompts = self.catalog.prompts.clone();
        if self.dynamic_prompt.load(Ordering::SeqCst) {
            prompts.push(self.catalog.dynamic_prompt.clone());
        }
        prompts
    }

    pub fn has_prompt(&self, name: &str) -> bool {
        self.prompts().iter().any(|prompt| prompt.name == name)
    }

    /// Flips the dynamic tool or prompt in or out of its list; answers whether it is now in.
    pub fn toggle(&self, change: ListChange) -> bool {
        let flag = match change {
            ListChange::Tools => &self.dynamic_tool,
            ListChange::Prompts => &self.dynamic_prompt,
        };
        !flag.fetch_xor(true, Ordering::SeqCst)
    }

    pub fn watched_text(&self) -> String {
        format!(
            "Watched resource content, version {}.",
            self.watched_version.load(Ordering::SeqCst)
        )
    }

    /// Changes the watched resource; answers its new version.
    pub fn bump_watched(&self) -> u64 {
        self.watched_version.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub fn add_session(&self, id: u64, peer: Peer<RoleServer>) {
        lock(&self.sessions).entry(id).or_insert(Session {
            peer,
            subscriptions: HashSet::new(),
        });
    }

    pub fn subscribe(&self, id: u64, peer: Peer<RoleServer>, uri: &str) {
        lock(&self.sessions)
            .entry(id)
            .or_insert(Session {
                peer,
                subscriptions: HashSet::new(),
            })
            .subscriptions
            .insert(uri.to_string());
    }

    pub fn unsubscribe(&self, id: u64, uri: &str) {
        if let Some(session) = lock(&self.sessions).get_mut(&id) {
            session.subscriptions.remove(uri);
        }
    }

    pub fn add_listener(&self, id: u64, sink: SubscriptionSink) {
        lock(&self.listeners).insert(id, sink);
    }

    pub fn remove_listener(&self, id: u64) {
        lock(&self.listeners).remove(&id);
    }

    /// Tells every session and every listen stream that asked for it that `change` happened.
    pub async fn announce(&self, change: ListChange) {
        for (id, peer) in self.session_peers(|_| true) {
            let sent = match change {
                ListChange::Tools => peer.notify_tool_list_changed().await,
                ListChange::Prompts => peer.notify_prompt_list_changed().await,
            };
            if sent.is_err() {
                self.forget_session(id);
            }
        }
        for (id, sink) in self.listener_sinks() {
            let sent = match change {
                ListChange::Tools => sink.notify_tool_list_changed().await,
                ListChange::Prompts => sink.notify_prompt_list_changed().await,
            };
            self.after_listener_send(id, sent);
        }
    }

    /// Tells the subscribers of the watched resource that it changed.
    pub async fn announce_watched(&self) {
        for (id, peer) in
            self.session_peers(|session| session.subscriptions.contains(WATCHED_RESOURCE))
        {
            let sent = peer
                .notify_resource_updated(ResourceUpdatedNotificationParam::new(WATCHED_RESOURCE))
                .await;
            if sent.is_err() {
                self.forget_session(id);
            }
        }
        for (id, sink) in self.listener_sinks() {
            let sent = sink.notify_resource_updated(WATCHED_RESOURCE).await;
            self.after_listener_send(id, sent);
        }
    }

    fn session_peers(&self, wanted: impl Fn(&Session) -> bool) -> Vec<(u64, Peer<RoleServer>)> {
        let mut sessions = lock(&self.sessions);
        sessions.retain(|_, session| !session.peer.is_transport_closed());
        sessions
            .iter()
            .filter(|(_, session)| wanted(session))
            .map(|(id, session)| (*id, session.peer.clone()))
            .collect()
    }

    fn forget_session(&self, id: u64) {
        lock(&self.sessions).remove(&id);
    }

    fn listener_sinks(&self) -> Vec<(u64, SubscriptionSink)> {
        lock(&self.listeners)
            .iter()
            .map(|(id, sink)| (*id, sink.clone()))
            .collect()
    }

    fn after_listener_send(&self, id: u64, sent: Result<(), SubscriptionSendError>) {
        match sent {
            // The stream's filter did not ask for this kind of notification: nothing to do.
            Ok(()) | Err(SubscriptionSendError::NotificationNotAccepted(_)) => {}
            Err(_) => self.remove_listener(id),
        }
    }
}

/// Hand-off for `test_reconnection` (SEP-1699 polling): the HTTP layer closes the call's
/// SSE stream, the client resumes it with `GET` + `Last-Event-ID`, and only then may the
/// tool answer, so its result travels on the resumed stream. Keyed by session id.
#[derive(Default)]
pub struct Reconnections {
    /// Streams closed on purpose: session id → the HTTP request ids of their POSTs.
    closed: Mutex<HashMap<String, HashSet<u64>>>,
    /// Signalled once per resumption; a permit is kept if the tool is not waiting yet.
    resumed: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Reconnections {
    pub fn closed(&self, session: &str, http_request_id: u64) {
        lock(&self.closed)
            .entry(session.to_string())
            .or_default()
            .insert(http_request_id);
    }

    /// A `GET` resumed `http_request_id`'s stream; wakes the tool if that stream was one it
    /// had closed.
    pub fn resumed(&self, session: &str, http_request_id: u64) {
        let was_closed = lock(&self.closed)
            .get_mut(session)
            .is_some_and(|ids| ids.remove(&http_request_id));
        if was_closed {
            self.notify(session).notify_one();
        }
    }

    /// Waits until the session's closed stream was resumed, or `patience` passed (a client
    /// that never resumes loses the answer, but the call does not wait forever).
    pub async fn wait(&self, session: &str, patience: Duration) {
        let notify = self.notify(session);
        let _ = tokio::time::timeout(patience, notify.notified()).await;
        lock(&self.resumed).remove(session);
    }

    fn notify(&self, session: &str) -> Arc<Notify> {
        lock(&self.resumed)
            .entry(session.to_string())
            .or_default()
            .clone()
    }
}

/// Locks `mutex`; a panic elsewhere while holding it leaves plain data that is still usable.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
