//! Where tokens are kept: a [`TokenStore`] holds one opaque record per server. The file store
//! (the CLI's) keeps each in `<dir>/<server>.json`, mode 0600, in a directory of mode 0700;
//! an embedder may keep them elsewhere (a keychain, a database) by implementing the trait.
//!
//! The record binds the tokens to the server's URL: tokens saved for another URL (the config
//! changed) are never sent.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use async_trait::async_trait;
use rmcp::transport::auth::{
    AuthError, CredentialRefreshGuard, CredentialStore, StoredCredentials,
};
use serde::{Deserialize, Serialize};

/// Keeps one record per server. Records hold secrets: a store must not log them.
pub trait TokenStore: Send + Sync + 'static {
    /// The record saved for `server`, if any.
    fn load(&self, server: &str) -> io::Result<Option<Vec<u8>>>;
    /// Replaces the record of `server`.
    fn save(&self, server: &str, record: &[u8]) -> io::Result<()>;
    /// Removes the record of `server` (nothing to remove is not an error).
    fn remove(&self, server: &str) -> io::Result<()>;
    /// Held across a token refresh, so that gateways sharing the store do not refresh one
    /// server at once (with rotating refresh tokens, the second would be refused). Blocking.
    fn lock(&self, _server: &str) -> io::Result<Option<Box<dyn Send>>> {
        Ok(None)
    }
}

/// The largest record read: a record is a few KiB; more is not ours.
const MAX_RECORD: u64 = 1 << 20;

/// Records as files in one directory (mode 0700), one per server (mode 0600).
#[derive(Debug)]
pub struct FileTokenStore {
    dir: PathBuf,
    /// The last record read per server, with the file's modification time and length: a
    /// request reads its token without reading the file again.
    cache: Mutex<std::collections::HashMap<String, Cached>>,
}

/// A record as read, with the file's modification time and length when it was read.
type Cached = (SystemTime, u64, Vec<u8>);

impl FileTokenStore {
    /// Records in `dir` (created when the first is saved).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            cache: Mutex::default(),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, server: &str) -> PathBuf {
        self.dir.join(format!("{server}.json"))
    }

    /// Creates the directory (0700), and makes an existing one private.
    fn ensure_dir(&self) -> io::Result<()> {
        fs::create_dir_all(&self.dir)?;
        let permissions = fs::Permissions::from_mode(0o700);
        fs::set_permissions(&self.dir, permissions)
    }
}

impl TokenStore for FileTokenStore {
    fn load(&self, server: &str) -> io::Result<Option<Vec<u8>>> {
        let path = self.path(server);
        let metadata = match fs::metadata(&path) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                self.cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(server);
                return Ok(None);
            }
            Err(error) => return Err(error),
        };
        if metadata.len() > MAX_RECORD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is larger than a token record can be", path.display()),
            ));
        }
        let stamp = (metadata.modified()?, metadata.len());
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((modified, len, record)) = cache.get(server)
            && (*modified, *len) == stamp
        {
            return Ok(Some(record.clone()));
        }
        let record = fs::read(&path)?;
        cache.insert(server.to_string(), (stamp.0, stamp.1, record.clone()));
        Ok(Some(record))
    }

    fn save(&self, server: &str, record: &[u8]) -> io::Result<()> {
        self.ensure_dir()?;
        let path = self.path(server);
        // Written whole to a private temporary file, then renamed over the record: a reader
        // never sees half a record, and the secret is never in a file others can read.
        // A name of its own per save: two saves of one record at once (a refresh and a login)
        // must not write into one file.
        static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let save = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let temporary = self
            .dir
            .join(format!(".{server}.json.{}.{save}.tmp", std::process::id()));
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)?;
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
        file.write_all(record)?;
        file.sync_all()?;
        fs::rename(&temporary, &path)?;
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(server);
        Ok(())
    }

    fn remove(&self, server: &str) -> io::Result<()> {
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(server);
        match fs::remove_file(self.path(server)) {
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn lock(&self, server: &str) -> io::Result<Option<Box<dyn Send>>> {
        self.ensure_dir()?;
        let file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.dir.join(format!(".{server}.lock")))?;
        file.lock()?;
        // Closing the file releases the lock.
        Ok(Some(Box::new(file)))
    }
}

/// Records in memory, for one run (the library's default).
#[derive(Debug, Default)]
pub struct MemoryTokenStore {
    records: Mutex<std::collections::HashMap<String, Vec<u8>>>,
}

impl TokenStore for MemoryTokenStore {
    fn load(&self, server: &str) -> io::Result<Option<Vec<u8>>> {
        Ok(self
            .records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(server)
            .cloned())
    }

    fn save(&self, server: &str, record: &[u8]) -> io::Result<()> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(server.to_string(), record.to_vec());
        Ok(())
    }

    fn remove(&self, server: &str) -> io::Result<()> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(server);
        Ok(())
    }
}

/// A server's record, as Tether writes it.
#[derive(Serialize, Deserialize)]
pub(crate) struct Record {
    /// The server URL the tokens were issued for.
    pub endpoint: String,
    /// The secret of a client Tether registered itself (dynamic registration), which rmcp's
    /// credentials do not carry; refreshing needs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// Set when the authorization server refused the refresh token: a login is needed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refresh_rejected: bool,
    pub credentials: Option<StoredCredentials>,
}

/// One server's record in a [`TokenStore`], as rmcp's credential store.
#[derive(Clone)]
pub(crate) struct ServerTokens {
    store: Arc<dyn TokenStore>,
    server: String,
    endpoint: String,
}

fn store_error(error: impl std::fmt::Display) -> AuthError {
    AuthError::CredentialStoreError(error.to_string())
}

impl ServerTokens {
    pub fn new(store: Arc<dyn TokenStore>, server: &str, endpoint: &str) -> Self {
        Self {
            store,
            server: server.to_string(),
            endpoint: endpoint.to_string(),
        }
    }

    /// The server's record, if it is for this endpoint and readable. A record that does not
    /// parse is treated as none (and replaced at the next login).
    pub fn record(&self) -> Result<Option<Record>, AuthError> {
        let Some(bytes) = self.store.load(&self.server).map_err(store_error)? else {
            return Ok(None);
        };
        match serde_json::from_slice::<Record>(&bytes) {
            Ok(record) if record.endpoint == self.endpoint => Ok(Some(record)),
            Ok(_) => Ok(None),
            Err(error) => {
                tracing::warn!(server = %self.server, "ignoring an unreadable token record: {error}");
                Ok(None)
            }
        }
    }

    pub fn write(&self, record: &Record) -> Result<(), AuthError> {
        let bytes = serde_json::to_vec_pretty(record).map_err(store_error)?;
        self.store.save(&self.server, &bytes).map_err(store_error)
    }

    /// Changes the record (a new one when there is none).
    pub fn update(&self, change: impl FnOnce(&mut Record)) -> Result<(), AuthError> {
        let mut record = self.record()?.unwrap_or_else(|| Record {
            endpoint: self.endpoint.clone(),
            client_secret: None,
            refresh_rejected: false,
            credentials: None,
        });
        change(&mut record);
        self.write(&record)
    }

    pub fn remove(&self) -> Result<(), AuthError> {
        self.store.remove(&self.server).map_err(store_error)
    }
}

#[async_trait]
impl CredentialStore for ServerTokens {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        Ok(self.record()?.and_then(|record| record.credentials))
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        self.update(|record| {
            record.refresh_rejected = false;
            record.credentials = Some(credentials);
        })
    }

    async fn clear(&self) -> Result<(), AuthError> {
        self.update(|record| record.credentials = None)
    }

    async fn on_refresh_token_rejected(
        &self,
        rejected: &StoredCredentials,
    ) -> Result<(), AuthError> {
        // Only if the record still holds the rejected tokens (another gateway may have
        // logged in since).
        let same = |stored: &StoredCredentials| {
            serde_json::to_value(stored).ok() == serde_json::to_value(rejected).ok()
        };
        if let Some(record) = self.record()?
            && record.credentials.as_ref().is_some_and(same)
        {
            self.update(|record| {
                record.refresh_rejected = true;
                record.credentials = None;
            })?;
        }
        Ok(())
    }

    async fn acquire_refresh_guard(&self) -> Result<Option<CredentialRefreshGuard>, AuthError> {
        let store = self.store.clone();
        let server = self.server.clone();
        let guard = tokio::task::spawn_blocking(move || store.lock(&server))
            .await
            .map_err(store_error)?
            .map_err(store_error)?;
        Ok(guard.map(CredentialRefreshGuard::new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_private_files_in_a_private_directory() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileTokenStore::new(dir.path().join("auth"));
        assert_eq!(store.load("web").unwrap(), None);
        store.save("web", b"{\"secret\": 1}").unwrap();
        let mode = |path: &Path| fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(store.dir()), 0o700);
        assert_eq!(mode(&store.dir().join("web.json")), 0o600);
        assert_eq!(store.load("web").unwrap().unwrap(), b"{\"secret\": 1}");
        // Another writer (another gateway) is seen at the next load.
        store.save("web", b"{\"secret\": 22}").unwrap();
        assert_eq!(store.load("web").unwrap().unwrap(), b"{\"secret\": 22}");
        store.remove("web").unwrap();
        assert_eq!(store.load("web").unwrap(), None);
        store.remove("web").unwrap();
    }

    #[test]
    fn a_record_for_another_url_is_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn TokenStore> = Arc::new(FileTokenStore::new(dir.path()));
        let old = ServerTokens::new(store.clone(), "web", "https://old.example/mcp");
        old.update(|record| record.client_secret = Some("s".into()))
            .unwrap();
        assert!(old.record().unwrap().is_some());
        let new = ServerTokens::new(store, "web", "https://new.example/mcp");
        assert!(new.record().unwrap().is_none());
    }
}
