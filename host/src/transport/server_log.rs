//! A stdio server's stderr log, `<log dir>/<server>.log`: private to the user (directory 0700,
//! file 0600, whatever the umask or an earlier run left), written by the server itself (its
//! stderr is the file, so nothing of Tether sits in the way and a server's last words survive
//! Tether), and kept bounded. Once a log reaches [`LOG_LIMIT`] (looked at when the server
//! starts, then every 10 s), its last [`LOG_LIMIT`] bytes are copied to `<server>.log.1` and the
//! log is emptied, as logrotate's `copytruncate` does (a line written during the copy may be
//! lost). The server appends, so it writes on at the new end. A server's logs take about twice
//! the limit, plus what it writes between two looks.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// The size at which a server's log is rotated.
pub const LOG_LIMIT: u64 = 10 << 20;
/// How often a running server's log size is looked at.
const CHECK_EVERY: Duration = Duration::from_secs(10);

/// A server's log file, as Tether holds it beside the server.
pub(crate) struct ServerLog {
    file: File,
    path: PathBuf,
    limit: u64,
}

/// The server's stderr log.
pub fn log_path(log_dir: &Path, server: &str) -> PathBuf {
    log_dir.join(format!("{server}.log"))
}

/// Where a log's earlier lines go.
fn previous_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".1");
    PathBuf::from(name)
}

impl ServerLog {
    /// Opens the server's log for appending (rotating a full one first) and writes a start
    /// header. The header never holds expanded values (arguments and paths may carry secrets):
    /// the server's name, the command's file name and the number of arguments only.
    pub(crate) fn open(
        server: &str,
        command: &str,
        arg_count: usize,
        log_dir: &Path,
    ) -> io::Result<Self> {
        Self::open_with_limit(server, command, arg_count, log_dir, LOG_LIMIT)
    }

    fn open_with_limit(
        server: &str,
        command: &str,
        arg_count: usize,
        log_dir: &Path,
        limit: u64,
    ) -> io::Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(log_dir)?;
        let dir = std::fs::metadata(log_dir)?;
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        // Never someone else's directory, nor a shared sticky one like /tmp.
        if dir.uid() == uid && dir.mode() & 0o1000 == 0 && dir.mode() & 0o777 != 0o700 {
            std::fs::set_permissions(log_dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let path = log_path(log_dir, server);
        // Readable too: a rotation copies from this very file.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(0o600)
            .open(&path)?;
        if file.metadata()?.mode() & 0o777 != 0o600 {
            file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
        let mut log = ServerLog { file, path, limit };
        // A log that cannot be rotated (a full disk) must not keep the server from starting.
        if let Err(error) = log.rotate_if_full() {
            tracing::warn!(log = %log.path.display(), "cannot rotate the server's log: {error}");
        }
        let program = Path::new(command)
            .file_name()
            .map_or_else(|| "?".into(), |name| name.to_string_lossy());
        writeln!(
            log.file,
            "=== {} tether starting {server}: {program} with {arg_count} args ===",
            humantime::format_rfc3339_seconds(std::time::SystemTime::now()),
        )?;
        Ok(log)
    }

    /// The file for the server's stderr (the same open file, appended to).
    pub(crate) fn for_child(&self) -> io::Result<File> {
        self.file.try_clone()
    }

    /// Keeps the log under its limit until the server has exited.
    pub(crate) async fn keep_bounded(self, mut exited: watch::Receiver<Option<Option<i32>>>) {
        let log = Arc::new(self);
        loop {
            tokio::select! {
                _ = exited.wait_for(Option::is_some) => return,
                () = tokio::time::sleep(CHECK_EVERY) => {}
            }
            let checked = log.clone();
            if let Ok(Err(error)) = tokio::task::spawn_blocking(move || checked.rotate_if_full()).await
            {
                tracing::warn!(log = %log.path.display(), "cannot rotate the server's log: {error}");
            }
        }
    }

    /// Once the log has reached its limit: its last `limit` bytes to `<log>.1`, and the log
    /// emptied (the server appends, so it writes on at the new end). Whether it rotated. The
    /// bytes are read from the open file itself; if the path no longer names it (moved away by
    /// someone else), it is only emptied, so it stays bounded all the same.
    fn rotate_if_full(&self) -> io::Result<bool> {
        let ours = self.file.metadata()?;
        let len = ours.len();
        if len < self.limit {
            return Ok(false);
        }
        let named = std::fs::metadata(&self.path)
            .is_ok_and(|named| named.dev() == ours.dev() && named.ino() == ours.ino());
        // A tail that cannot be kept (a full disk) is lost: the log stays bounded all the same.
        let kept = match named {
            true => self
                .keep_tail(len)
                .inspect_err(|error| {
                    tracing::warn!(log = %self.path.display(), "cannot keep the log's last lines: {error}");
                })
                .ok(),
            false => None,
        };
        self.file.set_len(0)?;
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
        match kept {
            Some(previous) => writeln!(
                &self.file,
                "=== {now} tether: earlier lines are in {} ===",
                previous.file_name().unwrap_or_default().to_string_lossy(),
            ),
            None => writeln!(
                &self.file,
                "=== {now} tether: the log reached its limit and was emptied ==="
            ),
        }?;
        Ok(true)
    }

    /// Copies the log's last `limit` bytes (of `len`) to `<log>.1`, through a temp file of this
    /// process's own (created new: never one someone else planted).
    fn keep_tail(&self, len: u64) -> io::Result<PathBuf> {
        let previous = previous_path(&self.path);
        let mut tmp = previous.clone().into_os_string();
        tmp.push(format!(".{}.tmp", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let _ = std::fs::remove_file(&tmp);
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        let copied = (|| {
            let mut buffer = vec![0; 64 << 10];
            let mut offset = len.saturating_sub(self.limit);
            while offset < len {
                let want = buffer.len().min((len - offset) as usize);
                let read = self.file.read_at(&mut buffer[..want], offset)?;
                if read == 0 {
                    break;
                }
                out.write_all(&buffer[..read])?;
                offset += read as u64;
            }
            std::fs::rename(&tmp, &previous)
        })();
        if copied.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        copied.map(|()| previous)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log written as a server writes it (its own appending handle), rotated at 1 KiB: the
    /// newest kilobyte goes to `.1`, the server writes on at the start of the emptied file, and
    /// a full log is moved aside when the server starts again.
    #[test]
    fn a_log_never_takes_more_than_twice_its_limit() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let log = ServerLog::open_with_limit("s", "/usr/bin/srv", 2, dir, 1024).unwrap();
        let mut server = log.for_child().unwrap();
        assert!(!log.rotate_if_full().unwrap(), "under the limit");
        for line in 0..100 {
            writeln!(server, "line {line:04} of the server's chatter").unwrap();
        }
        assert!(log.rotate_if_full().unwrap());
        let previous = std::fs::read_to_string(dir.join("s.log.1")).unwrap();
        assert_eq!(previous.len(), 1024);
        assert!(previous.ends_with("line 0099 of the server's chatter\n"));
        let mode = std::fs::metadata(dir.join("s.log.1")).unwrap().mode();
        assert_eq!(mode & 0o777, 0o600);
        writeln!(server, "after").unwrap();
        let current = std::fs::read_to_string(dir.join("s.log")).unwrap();
        assert!(current.contains("earlier lines are in s.log.1"), "{current}");
        assert!(current.ends_with("\nafter\n"), "{current}");
        assert!(current.len() < 200, "the server wrote at the new end: {current}");

        for _ in 0..40 {
            writeln!(server, "more of the server's chatter").unwrap();
        }
        drop((server, log));
        let restarted = ServerLog::open_with_limit("s", "/usr/bin/srv", 2, dir, 1024).unwrap();
        let moved = std::fs::read_to_string(dir.join("s.log.1")).unwrap();
        assert!(
            moved.len() == 1024 && moved.ends_with("more of the server's chatter\n"),
            "the full log was rotated at the start"
        );
        let current = std::fs::read_to_string(dir.join("s.log")).unwrap();
        assert!(current.starts_with("=== ") && current.contains("tether starting s: srv with 2 args"));

        // Moved away by someone else: emptied at the limit all the same.
        let mut server = restarted.for_child().unwrap();
        std::fs::rename(dir.join("s.log"), dir.join("elsewhere.log")).unwrap();
        for _ in 0..40 {
            writeln!(server, "more of the server's chatter").unwrap();
        }
        assert!(restarted.rotate_if_full().unwrap());
        let emptied = std::fs::read_to_string(dir.join("elsewhere.log")).unwrap();
        assert!(emptied.contains("reached its limit and was emptied"), "{emptied}");
        assert!(!emptied.contains("chatter"), "{emptied}");
        assert_eq!(std::fs::read_to_string(dir.join("s.log.1")).unwrap(), moved);
        drop(restarted);
    }

    /// A full disk, or a `.1` that cannot be replaced: the log is emptied all the same, and a
    /// server still starts.
    #[test]
    fn a_log_whose_tail_cannot_be_kept_is_emptied() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        std::fs::create_dir_all(dir.join("s.log.1")).unwrap();
        std::fs::write(dir.join("s.log"), "x".repeat(2048)).unwrap();
        let log = ServerLog::open_with_limit("s", "srv", 0, dir, 1024).expect("starts");
        let current = std::fs::read_to_string(dir.join("s.log")).unwrap();
        assert!(current.contains("reached its limit and was emptied"), "{current}");
        assert!(!current.contains("xxx"), "{current}");
        assert!(current.contains("tether starting s"), "{current}");
        drop(log);
    }
}
