//! The state file: where `tether serve` tells the CLI its admin address and token.
//!
//! It holds a secret, so it is created 0600 (set on the file itself, whatever the umask) in a
//! directory created 0700, and replaced atomically (write a temp file, then rename) so a reader
//! never sees half of it. It also records the gateway's pid, which the lock file records too.
//!
//! One gateway owns a state file at a time: [`lock`] takes an exclusive `flock` on
//! `<state file>.lock` (the state file itself is replaced on every write, so it cannot carry
//! the lock) and holds it for the life of the gateway. A second gateway is refused instead of
//! overwriting the first one's file; the kernel drops the lock of a process that dies, so a
//! crashed gateway's leftovers never block the next one. The lock is also how the CLI tells a
//! running gateway from a crashed one's leftovers ([`is_running`]): a pid may be reused.
//!
//! Where: an HTTP gateway uses [`default_path`] (`serve.json`), one at a time. Gateways on stdio
//! are started by agents — two agents, two gateways — so each gets its own file by default,
//! [`stdio_path`] (`stdio/<pid>.json`); [`running`] lists every live gateway, and the admin
//! commands pick one by pid when there are several.

use std::fs::{DirBuilder, File, OpenOptions, TryLockError};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What the state file says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StateFile {
    /// The admin API's address.
    pub addr: SocketAddr,
    /// Its bearer token.
    pub token: String,
    /// The process id of the gateway that wrote it.
    pub pid: u32,
    /// How the gateway serves MCP: `http` or `stdio`.
    #[serde(default)]
    pub serves: String,
    /// Its config file.
    #[serde(default)]
    pub config: Option<PathBuf>,
}

/// `$XDG_STATE_HOME/tether`, else `~/.local/state/tether`.
pub fn state_dir() -> PathBuf {
    dirs::state_dir()
        .or_else(|| dirs::home_dir().map(|home| home.join(".local").join("state")))
        .unwrap_or_else(std::env::temp_dir)
        .join("tether")
}

/// `$XDG_STATE_HOME/tether/serve.json`, else `~/.local/state/tether/serve.json`: an HTTP
/// gateway's state file.
pub fn default_path() -> PathBuf {
    state_dir().join("serve.json")
}

/// Where stdio gateways keep their state files, one each.
pub fn stdio_dir() -> PathBuf {
    state_dir().join("stdio")
}

/// The state file of the stdio gateway with process id `pid`.
pub fn stdio_path(pid: u32) -> PathBuf {
    stdio_dir().join(format!("{pid}.json"))
}

/// A live gateway and its state file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Running {
    /// The state file.
    pub path: PathBuf,
    /// What it says.
    pub state: StateFile,
}

/// Every gateway running with a state file in the default places: the HTTP one
/// ([`default_path`]) and each on stdio ([`stdio_dir`]), by pid. Leftovers of gateways that
/// died are removed on the way (their lock is free).
pub fn running() -> Vec<Running> {
    let mut found = Vec::new();
    let mut consider = |path: PathBuf| {
        let Ok(state) = read(&path) else { return };
        if is_running(&path, &state) {
            found.push(Running { path, state });
        } else if path.starts_with(stdio_dir()) {
            // A stdio gateway that died: nobody else will use its files, unless its pid is
            // reused by a gateway starting right now.
            remove_leftovers(&path, &state);
        }
    };
    consider(default_path());
    if let Ok(entries) = std::fs::read_dir(stdio_dir()) {
        let mut paths: Vec<PathBuf> = entries
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|e| e == "json"))
            .collect();
        paths.sort();
        for path in paths {
            consider(path);
        }
    }
    found.sort_by_key(|running| running.state.pid);
    found
}

/// Whether the gateway that wrote `state` to `path` still runs: it holds the state file's lock
/// for its whole life, and the kernel drops the lock when it dies. Its pid alone cannot say: a
/// SIGKILLed gateway's pid may belong to another process by now.
pub fn is_running(path: &Path, state: &StateFile) -> bool {
    let mut lock = match File::open(lock_path(path)) {
        Ok(file) => file,
        // Removed on a clean shutdown, never there for a gateway that did not start.
        Err(error) if error.kind() == io::ErrorKind::NotFound => return false,
        Err(_) => return process_exists(state.pid),
    };
    // Held for an instant only: a gateway starting meanwhile tries its lock again (`lock`).
    match lock.try_lock_shared() {
        Ok(()) => false,
        // Held by the gateway that wrote `state`, or by a newer one still starting, whose state
        // is not written yet (then `state` is a crashed gateway's).
        Err(TryLockError::WouldBlock) => holder_pid(&mut lock) == Some(state.pid),
        Err(TryLockError::Error(_)) => process_exists(state.pid),
    }
}

/// Removes a dead gateway's state and lock files, holding the lock meanwhile, so a gateway that
/// takes them at that moment keeps its own (see `lock`).
fn remove_leftovers(path: &Path, state: &StateFile) {
    let lock_file = lock_path(path);
    let still_the_dead_ones = || read(path).is_ok_and(|now| now == *state);
    let held = match OpenOptions::new().read(true).write(true).open(&lock_file) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            if still_the_dead_ones() {
                let _ = std::fs::remove_file(path);
            }
            return;
        }
        Err(_) => return,
    };
    if held.try_lock().is_err() {
        return;
    }
    let named = held.metadata().and_then(|ours| {
        std::fs::metadata(&lock_file)
            .map(|named| named.dev() == ours.dev() && named.ino() == ours.ino())
    });
    if named.is_ok_and(|same| same) {
        if still_the_dead_ones() {
            let _ = std::fs::remove_file(path);
        }
        let _ = std::fs::remove_file(&lock_file);
    }
}

/// Whether a process with this id runs.
fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let result = unsafe { libc::kill(pid, 0) };
    result == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The directory a state file lives in, created 0700 if missing.
fn create_dir(path: &Path) -> io::Result<&Path> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    Ok(dir)
}

/// Writes the state file for this process: 0600, parent directories created 0700, replaced
/// atomically. `serves` says how it serves MCP (`http` or `stdio`).
pub fn write(
    path: &Path,
    addr: SocketAddr,
    token: &str,
    serves: &str,
    config: Option<&Path>,
) -> io::Result<()> {
    let dir = create_dir(path)?;
    let contents = serde_json::to_vec_pretty(&StateFile {
        addr,
        token: token.to_string(),
        pid: std::process::id(),
        serves: serves.to_string(),
        config: config.map(Path::to_path_buf),
    })
    .map_err(io::Error::other)?;
    let file_name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    // A leftover from a crashed writer with this pid would make create_new fail.
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        // The umask may have taken bits away; set exactly 0600.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(&contents)?;
        file.write_all(b"\n")?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Reads a state file.
pub fn read(path: &Path) -> io::Result<StateFile> {
    let bytes = std::fs::read(path)?;
    serde_json::from_slice(&bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a Tether state file: {e}", path.display()),
        )
    })
}

/// Removes the state file on a clean shutdown, unless another gateway has since replaced it.
pub fn remove(path: &Path) {
    match read(path) {
        Ok(state) if state.pid != std::process::id() => {
            tracing::debug!(
                path = %path.display(),
                pid = state.pid,
                "leaving the state file: another gateway wrote it"
            );
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        _ => {
            if let Err(error) = std::fs::remove_file(path) {
                tracing::warn!(path = %path.display(), "cannot remove the state file: {error}");
            }
        }
    }
}

/// Why [`lock`] failed.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "another tether gateway{} is already running with the state file {}; stop it first, or give this one its own --state-file",
        pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default(),
        state_file.display()
    )]
    Held {
        state_file: PathBuf,
        /// The running gateway's pid, when it could be read.
        pid: Option<u32>,
    },
    #[error("cannot lock the state file {}: {error}", lock_file.display())]
    Io {
        lock_file: PathBuf,
        error: io::Error,
    },
}

/// This process's exclusive claim on a state file, held until dropped. Dropping it removes the
/// lock file (while still holding the lock) and releases the lock.
#[derive(Debug)]
pub struct StateLock {
    /// Open for as long as the lock is held: closing it releases the lock.
    _file: File,
    path: PathBuf,
}

impl Drop for StateLock {
    fn drop(&mut self) {
        // Whoever opened this file before the unlink finds, once it holds the lock, that the
        // path no longer names its file, and starts over on a fresh one (see `lock`).
        if let Err(error) = std::fs::remove_file(&self.path)
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), "cannot remove the lock file: {error}");
        }
        // Closing `_file` (next) releases the lock.
    }
}

/// `<state file>.lock`, beside the state file.
pub fn lock_path(state_file: &Path) -> PathBuf {
    let mut name = state_file
        .file_name()
        .map(std::ffi::OsStr::to_os_string)
        .unwrap_or_default();
    name.push(".lock");
    state_file.with_file_name(name)
}

/// Claims `state_file` for this process: an exclusive, non-blocking `flock` on
/// [`lock_path`], which then records this process's pid. Fails with [`LockError::Held`] (naming
/// the holder's pid when it can) if a live gateway holds it.
pub fn lock(state_file: &Path) -> Result<StateLock, LockError> {
    let path = lock_path(state_file);
    let io_error = |error| LockError::Io {
        lock_file: path.clone(),
        error,
    };
    if state_file.file_name().is_none() {
        return Err(io_error(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the path names no file",
        )));
    }
    create_dir(&path).map_err(io_error)?;
    // A holder may remove the file between our open and our lock; then try again on the new one.
    for _ in 0..16 {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false) // it may hold the running gateway's pid
            .mode(0o600)
            .open(&path)
            .map_err(io_error)?;
        match try_lock_patiently(&file) {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(LockError::Held {
                    state_file: state_file.to_path_buf(),
                    pid: holder_pid(&mut file).or_else(|| read(state_file).ok().map(|s| s.pid)),
                });
            }
            Err(TryLockError::Error(error)) => return Err(io_error(error)),
        }
        let ours = file.metadata().map_err(io_error)?;
        match std::fs::metadata(&path) {
            Ok(named) if named.dev() == ours.dev() && named.ino() == ours.ino() => {}
            Ok(_) => continue,
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(io_error(error)),
        }
        let recorded = (|| {
            file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            file.set_len(0)?;
            writeln!(file, "{}", std::process::id())?;
            file.sync_all()
        })();
        if let Err(error) = recorded {
            let _ = std::fs::remove_file(&path);
            return Err(io_error(error));
        }
        return Ok(StateLock { _file: file, path });
    }
    Err(io_error(io::Error::other(
        "the lock file kept being replaced; is another gateway starting and stopping?",
    )))
}

/// An exclusive lock on `file`, tried a few times over 50 ms: a CLI command checking whether a
/// gateway runs holds a shared lock for an instant ([`is_running`]), which must not make a
/// starting gateway think another one runs.
fn try_lock_patiently(file: &File) -> Result<(), TryLockError> {
    for _ in 0..10 {
        match file.try_lock() {
            Err(TryLockError::WouldBlock) => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            done => return done,
        }
    }
    file.try_lock()
}

/// The pid a lock holder recorded (none while it is still writing it).
fn holder_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_path_ends_in_tether_serve_json() {
        assert!(default_path().ends_with("tether/serve.json"));
    }

    #[test]
    fn the_lock_file_sits_beside_the_state_file() {
        assert_eq!(
            lock_path(Path::new("/run/tether/serve.json")),
            Path::new("/run/tether/serve.json.lock")
        );
    }

    #[test]
    fn one_lock_at_a_time_and_released_on_drop() {
        let dir = tempfile_dir();
        let state = dir.join("sub").join("serve.json");
        let first = lock(&state).unwrap();
        let text = std::fs::read_to_string(lock_path(&state)).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        let mode = std::fs::metadata(lock_path(&state))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // flock locks belong to the open file description: a second open conflicts, even in
        // the same process.
        match lock(&state) {
            Err(LockError::Held { state_file, pid }) => {
                assert_eq!(state_file, state);
                assert_eq!(pid, Some(std::process::id()));
            }
            other => panic!("expected Held, got {other:?}"),
        }
        drop(first);
        assert!(!lock_path(&state).exists());
        // A stale lock file nobody holds does not block.
        std::fs::write(lock_path(&state), "999999999\n").unwrap();
        let again = lock(&state).unwrap();
        drop(again);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_gateway_runs_while_it_holds_its_lock_whatever_its_pid() {
        let dir = tempfile_dir();
        let path = dir.join("stdio").join("1.json");
        // A live pid (this process) in every case: only the lock tells.
        let state = StateFile {
            addr: "127.0.0.1:9".parse().unwrap(),
            token: "t".into(),
            pid: std::process::id(),
            serves: "stdio".into(),
            config: None,
        };
        let held = lock(&path).unwrap();
        assert!(is_running(&path, &state), "the lock is held");
        // Asking takes a shared lock for an instant; a gateway starting meanwhile still gets
        // its own (here: the next one, once the holder is gone).
        drop(held);
        assert!(!is_running(&path, &state), "no lock file: a clean exit");
        std::fs::write(lock_path(&path), "1\n").unwrap();
        assert!(!is_running(&path, &state), "a lock nobody holds: a crash");
        let again = lock(&path).unwrap();
        assert!(is_running(&path, &state));
        // Held by a newer gateway still starting: the state is a crashed one's.
        let crashed = StateFile {
            pid: std::process::id() + 1,
            ..state.clone()
        };
        assert!(!is_running(&path, &crashed));
        drop(again);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "tether-state-lock-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
