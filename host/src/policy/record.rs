//! Know before you swap: a recording of the policy's inputs and outputs (JSON lines, one per
//! decision), which [`super::replay`] plays against a candidate policy to report where the
//! candidate would have decided differently.
//!
//! A recording holds no secrets: server configurations carry no commands, URLs, environment or
//! headers (only names, tool filters and policy overrides), fault texts are the host's own
//! classification, and tool descriptions and schemas are replaced by a digest (so a candidate
//! still sees when they changed).

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::PolicyError;
use super::bindings::v0_2::revision;
use super::types::{Action, Admission, CallRequest, Event, EventKind, Tool};

/// One line of a recording.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Record {
    /// The policy that decided what follows (at the start, and after each swap or fallback).
    Policy {
        /// Where the component came from (file path or other label).
        label: String,
        /// The implementation's name, as it reports it.
        name: String,
        /// The implementation's version, as it reports it.
        version: String,
        /// The contract version the component was built against.
        contract: String,
        /// Its settings, as a JSON object.
        settings: String,
    },
    /// An event and the actions it got.
    Event {
        /// The event fed to the policy.
        event: Event,
        /// The actions the policy returned (publications without descriptions and schemas).
        actions: Vec<Action>,
    },
    /// A call request and its admission.
    Admit {
        /// The request.
        request: CallRequest,
        /// The policy's answer.
        admission: Admission,
    },
    /// The settings changed.
    Settings {
        /// The new settings, as a JSON object.
        settings: String,
    },
}

/// Writes a recording. A line is flushed as soon as it is written: a recording cut short by a
/// crash holds every decision before it.
pub(crate) struct Recorder {
    out: BufWriter<File>,
    path: String,
}

impl Recorder {
    /// Starts a recording at `path` (private to the user), emptied only once this process holds
    /// its lock: a second gateway given the same file is refused instead of truncating the first
    /// one's recording. The lock lasts as long as the recorder.
    pub fn create(path: &Path) -> Result<Recorder, PolicyError> {
        let refused = |reason: String| PolicyError::Read {
            policy: "the recording".into(),
            reason,
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| refused(format!("cannot create {}: {e}", path.display())))?;
        // A pipe or a device (`/dev/stderr`, `>(gzip > run.gz)`) is written to as it is.
        let regular = file.metadata().is_ok_and(|meta| meta.file_type().is_file());
        if regular {
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(refused(format!(
                        "{} is being recorded to by another gateway; give each its own --record file",
                        path.display()
                    )));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(refused(format!("cannot lock {}: {e}", path.display())));
                }
            }
            file.set_len(0)
                .map_err(|e| refused(format!("cannot empty {}: {e}", path.display())))?;
        }
        Ok(Recorder {
            out: BufWriter::new(file),
            path: path.display().to_string(),
        })
    }

    pub fn write(&mut self, record: Record) {
        let line = serde_json::to_string(&redacted(record)).unwrap_or_default();
        let written = writeln!(self.out, "{line}").and_then(|()| self.out.flush());
        if let Err(e) = written {
            tracing::warn!(path = %self.path, "cannot write the policy recording: {e}");
        }
    }
}

/// Tools as a recording keeps them: names, read-only, and a digest of the rest.
fn redact_tools(tools: &mut [Tool]) {
    for tool in tools {
        let digest = revision(tool);
        tool.description = None;
        tool.input_schema = format!("digest:{digest:016x}");
    }
}

/// Publications without descriptions and schemas (which come from the host, not the policy).
pub(crate) fn redact_actions(actions: &mut [Action]) {
    for action in actions {
        if let Action::PublishTools(publication) = action {
            for tool in &mut publication.tools {
                tool.description = None;
                tool.input_schema = String::new();
            }
        }
    }
}

fn redacted(mut record: Record) -> Record {
    if let Record::Event { event, actions } = &mut record {
        match &mut event.kind {
            EventKind::Connected(session) => redact_tools(&mut session.tools),
            EventKind::ToolsChanged(change) => redact_tools(&mut change.tools),
            _ => {}
        }
        redact_actions(actions);
    }
    record
}

/// Where a candidate decided otherwise than the recording.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Divergence {
    /// The recording's line (1-based).
    pub line: usize,
    /// The server the decision was about (`(all)` for a shutdown).
    pub server: String,
    /// What diverged: `"<event> actions"` or `"admission"`.
    pub kind: String,
    /// The recorded decision, as JSON.
    pub recorded: serde_json::Value,
    /// The candidate's decision, as JSON.
    pub candidate: serde_json::Value,
}

/// Reads a recording.
pub fn read(path: &Path) -> Result<Vec<(usize, Record)>, String> {
    let file = File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut records = Vec::new();
    for (index, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let record = serde_json::from_str(&line).map_err(|e| {
            format!(
                "{} line {}: not a policy recording: {e}",
                path.display(),
                index + 1
            )
        })?;
        records.push((index + 1, record));
    }
    Ok(records)
}

/// The settings a recording started with.
pub fn initial_settings(records: &[(usize, Record)]) -> Option<&str> {
    records.iter().find_map(|(_, record)| match record {
        Record::Policy { settings, .. } => Some(settings.as_str()),
        _ => None,
    })
}

/// The contract's name of an event kind.
pub(crate) fn event_name(kind: &EventKind) -> &'static str {
    match kind {
        EventKind::ServerConfigured(_) => "server-configured",
        EventKind::ServerRemoved(_) => "server-removed",
        EventKind::Connected(_) => "connected",
        EventKind::ConnectFailed(_) => "connect-failed",
        EventKind::Disconnected(_) => "disconnected",
        EventKind::ToolsChanged(_) => "tools-changed",
        EventKind::KeepaliveOk(_) => "keepalive-ok",
        EventKind::KeepaliveFailed(_) => "keepalive-failed",
        EventKind::CallFinished(_) => "call-finished",
        EventKind::Timer(_) => "timer",
        EventKind::ReconnectRequested(_) => "reconnect-requested",
        EventKind::Shutdown => "shutdown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_recorder_a_file_and_the_second_is_refused_without_harm() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let path = dir.join("run.jsonl");
        let mut first = Recorder::create(&path).unwrap();
        first.write(Record::Settings {
            settings: "{}".into(),
        });
        let written = std::fs::read_to_string(&path).unwrap();
        assert!(!written.is_empty());
        let second = Recorder::create(&path).map(|_| ());
        assert!(
            matches!(&second, Err(e) if e.to_string().contains("another gateway")),
            "{second:?}"
        );
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            written,
            "not truncated"
        );
        let mode = std::fs::metadata(&path).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        drop(first);
        Recorder::create(&path).expect("free again once the first has ended");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        // Not a file: written to as it is, by as many as want to.
        let _sink = Recorder::create(Path::new("/dev/null")).unwrap();
        Recorder::create(Path::new("/dev/null")).expect("a device is not locked");
    }
}
