//! Who hears what: the downstream sessions and what each asked to be told.
//!
//! Clients of 2025-11-25 and older (registered when initialized) get unscoped notifications:
//! every list change, updates of the resources they subscribed to, and log messages at or above
//! the level they set. 2026-07-28 clients get notifications only on the `subscriptions/listen`
//! streams they opened, and only what the stream accepted. Each client's notifications go out
//! in order from a task of its own: a stalled client never delays the others.

#![allow(deprecated)] // logging and resources/subscribe are legacy-only, and still served

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use rmcp::model::{
    LoggingLevel, LoggingMessageNotificationParam, ResourceUpdatedNotificationParam,
    SubscriptionFilter,
};
use rmcp::service::SubscriptionSink;
use rmcp::{Peer, RoleServer};
use tokio::sync::mpsc;

use crate::catalog::CatalogChange;

/// A session of 2025-11-25 or older.
struct LegacySession {
    session: u64,
    peer: Peer<RoleServer>,
    outbox: Outbox,
    subscribed: BTreeSet<String>,
    log_level: Option<LoggingLevel>,
}

/// What a session's leaving releases.
pub(super) struct Left {
    /// The URIs nobody downstream wants any more.
    pub(super) unwanted: Vec<String>,
    /// Whether a session that had set a log level left (the servers' level may drop).
    pub(super) level_dropped: bool,
}

/// A 2026-07-28 `subscriptions/listen` stream.
struct Stream {
    id: u64,
    sink: SubscriptionSink,
    outbox: Outbox,
    accepted: SubscriptionFilter,
}

#[derive(Default)]
struct Listeners {
    sessions: Vec<LegacySession>,
    streams: Vec<Stream>,
    next_stream: u64,
    /// URIs a session or stream that has gone had subscribed to: upstream, they may be
    /// unsubscribed once nobody else wants them (see [`Downstream::leave`]).
    released: BTreeSet<String>,
    /// Whether a session that had set a log level has gone since the last [`Downstream::leave`].
    level_released: bool,
}

impl Listeners {
    fn wants(&self, uri: &str) -> bool {
        self.sessions.iter().any(|s| s.subscribed.contains(uri))
            || self.streams.iter().any(|s| {
                s.accepted
                    .resource_subscriptions
                    .as_ref()
                    .is_some_and(|uris| uris.iter().any(|u| u == uri))
            })
    }

    /// The released URIs nobody wants any more (the others stay subscribed upstream).
    fn take_unwanted(&mut self) -> Vec<String> {
        let released = std::mem::take(&mut self.released);
        released
            .into_iter()
            .filter(|uri| !self.wants(uri))
            .collect()
    }
}

#[derive(Clone, Default)]
pub(super) struct Downstream {
    listeners: Arc<Mutex<Listeners>>,
}

impl Downstream {
    fn lock(&self) -> std::sync::MutexGuard<'_, Listeners> {
        let mut listeners = self.listeners.lock().unwrap_or_else(|e| e.into_inner());
        let Listeners {
            sessions,
            released,
            level_released,
            ..
        } = &mut *listeners;
        sessions.retain_mut(|s| {
            let open = !s.peer.is_transport_closed();
            if !open {
                released.append(&mut s.subscribed);
                *level_released |= s.log_level.is_some();
            }
            open
        });
        listeners
    }

    /// A session ended (rmcp's handle on it is gone; an unregistered one is no error): forgets
    /// it and says what the servers may need to be told. Without Tether, a client's leaving
    /// would end its subscriptions and its log level with its session.
    pub(super) fn leave(&self, session: u64) -> Left {
        let mut listeners = self.lock();
        if let Some(at) = listeners.sessions.iter().position(|s| s.session == session) {
            let mut gone = listeners.sessions.remove(at);
            listeners.released.append(&mut gone.subscribed);
            listeners.level_released |= gone.log_level.is_some();
        }
        Left {
            unwanted: listeners.take_unwanted(),
            level_dropped: std::mem::take(&mut listeners.level_released),
        }
    }

    /// A legacy session finished its handshake.
    pub(super) fn register(&self, session: u64, peer: Peer<RoleServer>) {
        let mut listeners = self.lock();
        listeners.sessions.retain(|s| s.session != session);
        listeners.sessions.push(LegacySession {
            session,
            peer,
            outbox: Outbox::new(),
            subscribed: BTreeSet::new(),
            log_level: None,
        });
    }

    /// `resources/subscribe` from a legacy session; false if the session is unknown.
    pub(super) fn subscribe(&self, session: u64, uri: &str) -> bool {
        self.with_session(session, |s| {
            s.subscribed.insert(uri.to_string());
        })
    }

    /// `resources/unsubscribe`; the URIs nobody wants any more (`uri` unless another session
    /// or stream wants it, and any a session that left had).
    pub(super) fn unsubscribe(&self, session: u64, uri: &str) -> Vec<String> {
        let mut listeners = self.lock();
        if let Some(found) = listeners.sessions.iter_mut().find(|s| s.session == session)
            && found.subscribed.remove(uri)
        {
            listeners.released.insert(uri.to_string());
        }
        listeners.take_unwanted()
    }

    /// `logging/setLevel` from a legacy session.
    pub(super) fn set_log_level(&self, session: u64, level: LoggingLevel) -> bool {
        self.with_session(session, |s| s.log_level = Some(level))
    }

    /// The most verbose level any legacy session set, if one did.
    pub(super) fn most_verbose_level(&self) -> Option<LoggingLevel> {
        let listeners = self.lock();
        let levels = listeners.sessions.iter().filter_map(|s| s.log_level);
        levels.min_by_key(|level| severity(*level))
    }

    /// The level a legacy session set (`logging/setLevel`), if any.
    pub(super) fn log_level(&self, session: u64) -> Option<LoggingLevel> {
        let listeners = self.lock();
        listeners
            .sessions
            .iter()
            .find(|s| s.session == session)
            .and_then(|s| s.log_level)
    }

    fn with_session(&self, session: u64, change: impl FnOnce(&mut LegacySession)) -> bool {
        let mut listeners = self.lock();
        match listeners.sessions.iter_mut().find(|s| s.session == session) {
            Some(found) => {
                change(found);
                true
            }
            None => false,
        }
    }

    /// Whether any session or stream still wants updates of `uri`.
    pub(super) fn wanted(&self, uri: &str) -> bool {
        self.lock().wants(uri)
    }

    /// Every URI some session or stream wants updates of.
    pub(super) fn subscribed_uris(&self) -> BTreeSet<String> {
        let listeners = self.lock();
        let mut uris: BTreeSet<String> = listeners
            .sessions
            .iter()
            .flat_map(|s| s.subscribed.iter().cloned())
            .collect();
        for stream in &listeners.streams {
            uris.extend(
                stream
                    .accepted
                    .resource_subscriptions
                    .iter()
                    .flatten()
                    .cloned(),
            );
        }
        uris
    }

    pub(super) fn add_stream(&self, sink: SubscriptionSink, accepted: SubscriptionFilter) -> u64 {
        let mut listeners = self.lock();
        let id = listeners.next_stream;
        listeners.next_stream += 1;
        listeners.streams.push(Stream {
            id,
            sink,
            outbox: Outbox::new(),
            accepted,
        });
        id
    }

    /// A listen stream ended; the URIs nobody wants any more, as [`Downstream::leave`].
    pub(super) fn remove_stream(&self, id: u64) -> Vec<String> {
        let mut listeners = self.lock();
        if let Some(at) = listeners.streams.iter().position(|s| s.id == id) {
            let gone = listeners.streams.remove(at);
            let uris = gone.accepted.resource_subscriptions.into_iter().flatten();
            listeners.released.extend(uris);
        }
        listeners.take_unwanted()
    }

    /// Tells every client that the visible tools changed (`tools/list_changed`).
    pub(super) fn tools_changed(&self) {
        let listeners = self.lock();
        for session in &listeners.sessions {
            let peer = session.peer.clone();
            session
                .outbox
                .send(async move { peer.notify_tool_list_changed().await });
        }
        for stream in listeners
            .streams
            .iter()
            .filter(|s| on(s.accepted.tools_list_changed))
        {
            let sink = stream.sink.clone();
            stream
                .outbox
                .send(async move { sink.notify_tool_list_changed().await });
        }
    }

    pub(super) fn catalog_changed(&self, change: CatalogChange) {
        let listeners = self.lock();
        for session in &listeners.sessions {
            if change.prompts {
                let peer = session.peer.clone();
                session
                    .outbox
                    .send(async move { peer.notify_prompt_list_changed().await });
            }
            if change.resources {
                let peer = session.peer.clone();
                session
                    .outbox
                    .send(async move { peer.notify_resource_list_changed().await });
            }
        }
        for stream in &listeners.streams {
            if change.prompts && on(stream.accepted.prompts_list_changed) {
                let sink = stream.sink.clone();
                stream
                    .outbox
                    .send(async move { sink.notify_prompt_list_changed().await });
            }
            if change.resources && on(stream.accepted.resources_list_changed) {
                let sink = stream.sink.clone();
                stream
                    .outbox
                    .send(async move { sink.notify_resource_list_changed().await });
            }
        }
    }

    pub(super) fn resource_updated(&self, uri: &str) {
        let listeners = self.lock();
        for session in listeners
            .sessions
            .iter()
            .filter(|s| s.subscribed.contains(uri))
        {
            let (peer, uri) = (session.peer.clone(), uri.to_string());
            session.outbox.send(async move {
                peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                    .await
            });
        }
        for stream in &listeners.streams {
            let accepted = stream.accepted.resource_subscriptions.as_ref();
            if accepted.is_some_and(|uris| uris.iter().any(|u| u == uri)) {
                let (sink, uri) = (stream.sink.clone(), uri.to_string());
                stream
                    .outbox
                    .send(async move { sink.notify_resource_updated(uri).await });
            }
        }
    }

    /// A server's log message, to the legacy sessions whose level it meets, its logger named
    /// after the server (`<server>` or `<server>/<logger>`).
    pub(super) fn log(&self, server: &str, message: LoggingMessageNotificationParam) {
        let message = attributed(server, message);
        let listeners = self.lock();
        for session in &listeners.sessions {
            if session
                .log_level
                .is_some_and(|wanted| severity(message.level) >= severity(wanted))
            {
                let (peer, message) = (session.peer.clone(), message.clone());
                session
                    .outbox
                    .send(async move { peer.notify_logging_message(message).await });
            }
        }
    }
}

fn on(flag: Option<bool>) -> bool {
    flag == Some(true)
}

/// Notifications to one client, sent by one task in the order they were made (a task each
/// would let a burst of log messages overtake one another): a client that reads slowly gets
/// them late, and one that stops reading misses those past the backlog, with memory bounded.
/// The task ends with the session's entry.
#[derive(Clone)]
struct Outbox(mpsc::Sender<BoxFuture<'static, ()>>);

/// Notifications waiting for one client.
const OUTBOX_BACKLOG: usize = 1024;

impl Outbox {
    fn new() -> Self {
        let (notices, mut pending) = mpsc::channel::<BoxFuture<'static, ()>>(OUTBOX_BACKLOG);
        tokio::spawn(async move {
            while let Some(notice) = pending.recv().await {
                notice.await;
            }
        });
        Self(notices)
    }

    /// Queues one notification; a client that left is no error worth more than debug.
    fn send<E: std::fmt::Display>(
        &self,
        notification: impl Future<Output = Result<(), E>> + Send + 'static,
    ) {
        let notice = Box::pin(async move {
            if let Err(error) = notification.await {
                tracing::debug!("could not notify a downstream client: {error}");
            }
        });
        if self.0.try_send(notice).is_err() {
            tracing::debug!("a client too slow to read its notifications misses one");
        }
    }
}

/// A server's log message as clients see it: its logger named after the server (`<server>` or
/// `<server>/<logger>`), without the server's `_meta`.
pub(super) fn attributed(
    server: &str,
    mut message: LoggingMessageNotificationParam,
) -> LoggingMessageNotificationParam {
    message.logger = Some(match message.logger.take() {
        Some(logger) => format!("{server}/{logger}"),
        None => server.to_string(),
    });
    message.meta = None;
    message
}

/// RFC 5424 order, least severe first.
pub(super) fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}
