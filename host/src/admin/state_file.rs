//! The state file: where `tether serve` tells the CLI its admin address and token.
//!
//! It holds a secret, so it is created 0600 (set on the file itself, whatever the umask) in a
//! directory created 0700, and replaced atomically (write a temp file, then rename) so a reader
//! never sees half of it. It also records the gateway's pid, so the CLI can tell a stale file
//! from a running gateway.

use std::fs::{DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
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
}

/// `$XDG_STATE_HOME/tether/serve.json`, else `~/.local/state/tether/serve.json`.
pub fn default_path() -> PathBuf {
    dirs::state_dir()
        .or_else(|| dirs::home_dir().map(|home| home.join(".local").join("state")))
        .unwrap_or_else(std::env::temp_dir)
        .join("tether")
        .join("serve.json")
}

/// Writes the state file for this process: 0600, parent directories created 0700, replaced
/// atomically.
pub fn write(path: &Path, addr: SocketAddr, token: &str) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let contents = serde_json::to_vec_pretty(&StateFile {
        addr,
        token: token.to_string(),
        pid: std::process::id(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_path_ends_in_tether_serve_json() {
        assert!(default_path().ends_with("tether/serve.json"));
    }
}
