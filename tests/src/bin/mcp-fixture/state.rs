//! The state directory: what tests read back after (or while) the fixture runs.
//!
//! - `starts`: process starts (plain integer).
//! - `initializes`: `initialize` requests received (plain integer).
//! - `calls.log`: one `<tool> <arguments-json>` line per executed call, fsynced before the
//!   answer is sent.
//! - `pid`: the current process id.
//! - `cancelled`: tool calls cancelled by their client while running (plain integer).
//! - `subscriptions.log`: one `subscribe <uri>` / `unsubscribe <uri>` line per request.
//! - `control.json`: written by tests, read here.
//!
//! Counters are replaced atomically (write + rename) so a reader never sees a torn value.

use std::{
    fs::{self, OpenOptions},
    io::{self, Write},
    path::{Path, PathBuf},
    sync::Mutex,
};

pub const STARTS: &str = "starts";
pub const INITIALIZES: &str = "initializes";
pub const CALLS_LOG: &str = "calls.log";
pub const PID: &str = "pid";
pub const CONTROL: &str = "control.json";
/// Tool calls whose client cancelled them while they ran (plain integer).
pub const CANCELLED: &str = "cancelled";
/// One `subscribe <uri>` or `unsubscribe <uri>` line per request.
pub const SUBSCRIPTIONS_LOG: &str = "subscriptions.log";
/// `setLevel <level>` for each `logging/setLevel` received.
pub const LOGGING_LOG: &str = "logging.log";

pub struct StateDir {
    dir: PathBuf,
    // Serialises read-modify-write of counters and appends within this process.
    lock: Mutex<()>,
}

impl StateDir {
    pub fn open(dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
            lock: Mutex::new(()),
        })
    }

    /// Increments the counter file `name` and returns the new value.
    pub fn bump(&self, name: &str) -> io::Result<u64> {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let path = self.dir.join(name);
        let current = match fs::read_to_string(&path) {
            Ok(text) => text.trim().parse::<u64>().unwrap_or(0),
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        let next = current + 1;
        self.replace(name, &format!("{next}\n"))?;
        Ok(next)
    }

    pub fn write_pid(&self) -> io::Result<()> {
        self.replace(PID, &format!("{}\n", std::process::id()))
    }

    /// Appends one executed call to `calls.log` and fsyncs it, so the record survives a
    /// crash that follows immediately.
    pub fn append_call(&self, tool: &str, arguments: &serde_json::Value) -> io::Result<()> {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(CALLS_LOG))?;
        file.write_all(format!("{tool} {arguments}\n").as_bytes())?;
        file.sync_data()
    }

    /// Appends one line to the log file `name`.
    pub fn append_line(&self, name: &str, line: &str) -> io::Result<()> {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(name))?;
        file.write_all(format!("{line}\n").as_bytes())
    }

    /// The text of `control.json`, or `None` when there is none.
    pub fn read_control(&self) -> io::Result<Option<String>> {
        match fs::read_to_string(self.dir.join(CONTROL)) {
            Ok(text) => Ok(Some(text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn replace(&self, name: &str, contents: &str) -> io::Result<()> {
        let tmp = self.dir.join(format!(".{name}.{}.tmp", std::process::id()));
        fs::write(&tmp, contents)?;
        fs::rename(&tmp, self.dir.join(name))
    }
}
