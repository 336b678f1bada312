//! The level servers of 2025-11-25 and older send their log messages at. Without Tether a
//! client's `logging/setLevel` reaches its server, which then sends what that client asked
//! for. Through Tether one server session serves every client, so each server that offers
//! logging is told the most verbose level any client session set, and each client gets what
//! its own level lets through (`downstream.rs`). A server's new session is told again; when
//! the most verbose client leaves, the servers are told the next one's level. When no client
//! has a level any more, the servers keep the last one (MCP has no way to unset it).

#![allow(deprecated)] // logging is legacy-only, and legacy servers need it

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use rmcp::model::LoggingLevel;

use crate::upstream::Session;

use super::Gateway;

/// How long a server may take to answer `logging/setLevel`: a client's `setLevel` waits for
/// the servers, and one busy or hung must not hold it (nor the next level) for a call's time.
const SET_LEVEL_WAIT: Duration = Duration::from_secs(5);

/// What each server's session was last told.
#[derive(Default)]
pub(super) struct LogLevels {
    /// Held while telling, so that levels go out in the order they were decided.
    told: tokio::sync::Mutex<HashMap<String, (Weak<Session>, LoggingLevel)>>,
    /// Whether any server was ever told a level (until then, nothing needs telling again).
    any_told: std::sync::atomic::AtomicBool,
}

impl LogLevels {
    /// Whether a server may need telling again (a client set a level once).
    pub(super) fn in_use(&self) -> bool {
        self.any_told.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Gateway {
    /// Tells the servers (`only` one, or all) whose live session was not told the most
    /// verbose level the clients want now. Errors are logged: a server that cannot take the
    /// level still serves everything else.
    pub(super) async fn tell_log_levels(&self, only: Option<&str>) {
        let levels = &self.log_levels;
        let mut told = levels.told.lock().await;
        let Some(wanted) = self.downstream.most_verbose_level() else {
            return;
        };
        let servers = match only {
            Some(server) => vec![server.to_string()],
            None => self.supervisor.shared.server_names(),
        };
        let mut telling = Vec::new();
        for server in servers {
            let Some((session, spec)) = self.live(&server) else {
                continue;
            };
            let already = told.get(&server).is_some_and(|(last, level)| {
                std::ptr::eq(last.as_ptr(), Arc::as_ptr(&session)) && *level == wanted
            });
            if !already {
                telling.push((server, session, spec));
            }
        }
        let sent = telling.iter().map(|(server, session, spec)| async move {
            let sent = session.set_log_level(wanted, &spec.timeouts);
            match tokio::time::timeout(SET_LEVEL_WAIT, sent).await {
                Ok(Ok(taken)) => Some(taken),
                Ok(Err(failure)) => {
                    let why = super::failure_words(&failure);
                    tracing::debug!(%server, "logging/setLevel: {why}");
                    None
                }
                Err(_) => {
                    tracing::debug!(%server, "logging/setLevel: no answer in {SET_LEVEL_WAIT:?}");
                    None
                }
            }
        });
        let outcomes = futures::future::join_all(sent).await;
        for ((server, session, _), outcome) in telling.into_iter().zip(outcomes) {
            // Told, or with no level to set: not asked again on this session (a failure is).
            let Some(taken) = outcome else { continue };
            told.insert(server, (Arc::downgrade(&session), wanted));
            if taken {
                levels
                    .any_told
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}
