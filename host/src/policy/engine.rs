//! Compiling and vetting policy components: one wasmtime `Engine` and `Linker` per host, a cache
//! of precompiled artifacts keyed by the engine's compatibility hash, and the contract version
//! check that refuses incompatible components with a clear reason.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Linker};

use super::bindings::{self, CONTRACT_PACKAGE, Contract, Prepared};
use super::store::StoreState;
use super::{PolicyError, PolicyFault};

/// The default policy, built from `guest/` for wasm32-wasip2 by `host/build.rs`.
pub static EMBEDDED_DEFAULT_POLICY: &[u8] = include_bytes!(env!("TETHER_DEFAULT_POLICY_WASM"));

/// The default policy precompiled by `host/build.rs` for the machine that built this binary
/// (empty when cross-compiled). Used when it suits the running engine; otherwise the policy is
/// compiled (and cached) as any other.
static EMBEDDED_DEFAULT_POLICY_ARTIFACT: &[u8] =
    include_bytes!(env!("TETHER_DEFAULT_POLICY_CWASM"));

/// Where a policy component comes from.
#[derive(Debug, Clone)]
pub enum PolicySource {
    /// The default policy compiled into this binary.
    Embedded,
    /// A component file.
    File(PathBuf),
    /// Component bytes received from somewhere (e.g. the admin API), with a name for messages.
    Bytes {
        /// A name for messages.
        label: String,
        /// The component bytes.
        bytes: Vec<u8>,
    },
    /// A component this host has already compiled and vetted.
    Loaded(Arc<LoadedPolicy>),
}

impl PolicySource {
    /// Its name for messages (for a file, the path).
    pub fn label(&self) -> String {
        match self {
            PolicySource::Embedded => "embedded default policy".to_string(),
            PolicySource::File(path) => path.display().to_string(),
            PolicySource::Bytes { label, .. } => label.clone(),
            PolicySource::Loaded(policy) => policy.label().to_string(),
        }
    }
}

/// Shared compilation machinery.
pub struct PolicyEngine {
    engine: Engine,
    linker: Linker<StoreState>,
    cache_dir: Option<PathBuf>,
    /// Components compiled by this engine, by digest: reloading one (swap back, fallback to the
    /// default) costs nothing.
    compiled: Mutex<HashMap<String, Component>>,
    compilations: AtomicU64,
}

impl std::fmt::Debug for PolicyEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyEngine")
            .field("cache_dir", &self.cache_dir)
            .finish_non_exhaustive()
    }
}

impl PolicyEngine {
    /// `cache_dir`: where precompiled artifacts are kept (`None` disables the cache).
    pub fn new(cache_dir: Option<PathBuf>) -> Result<Arc<Self>, PolicyError> {
        let engine = Engine::new(&super::engine_config::engine_config())
            .map_err(|e| PolicyError::Engine(format!("{e:#}")))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| PolicyError::Engine(format!("{e:#}")))?;
        output_streams_on_any_thread(&mut linker)
            .map_err(|e| PolicyError::Engine(format!("{e:#}")))?;
        bindings::add_to_linker(&mut linker).map_err(|e| PolicyError::Engine(format!("{e:#}")))?;
        Ok(Arc::new(Self {
            engine,
            linker,
            cache_dir,
            compiled: Mutex::default(),
            compilations: AtomicU64::new(0),
        }))
    }

    /// The wasmtime engine policies are compiled for.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Compiles (or loads from the cache) and vets a policy component.
    pub fn load(self: &Arc<Self>, source: &PolicySource) -> Result<Arc<LoadedPolicy>, PolicyError> {
        let label = source.label();
        if let PolicySource::Loaded(policy) = source {
            return Ok(policy.clone());
        }
        let bytes: std::borrow::Cow<'_, [u8]> = match source {
            PolicySource::Embedded => EMBEDDED_DEFAULT_POLICY.into(),
            PolicySource::File(path) => std::fs::read(path)
                .map_err(|e| PolicyError::Read {
                    policy: label.clone(),
                    reason: e.to_string(),
                })?
                .into(),
            PolicySource::Bytes { bytes, .. } => bytes.as_slice().into(),
            PolicySource::Loaded(_) => unreachable!("returned above"),
        };
        let digest = hex::encode(Sha256::digest(&bytes));
        let precompiled = matches!(source, PolicySource::Embedded)
            .then_some(EMBEDDED_DEFAULT_POLICY_ARTIFACT)
            .filter(|artifact| !artifact.is_empty());
        let component = self.compile(&label, &bytes, &digest, precompiled)?;
        let (version, contract) = contract_version(&self.engine, &component, &label)?;
        let instance_pre =
            self.linker
                .instantiate_pre(&component)
                .map_err(|e| PolicyError::NotAPolicy {
                    policy: label.clone(),
                    reason: format!("it needs something this host does not provide: {e:#}"),
                })?;
        let pre =
            contract
                .prepare(&component, instance_pre)
                .map_err(|e| PolicyError::NotAPolicy {
                    policy: label.clone(),
                    reason: format!("its exports do not match tether:policy@{version}: {e:#}"),
                })?;
        Ok(Arc::new(LoadedPolicy {
            engine: self.clone(),
            pre,
            label,
            digest,
            version,
            contract,
        }))
    }

    /// How many components this engine has compiled (rather than loaded precompiled).
    pub fn compilations(&self) -> u64 {
        self.compilations.load(Ordering::Relaxed)
    }

    fn compile(
        &self,
        label: &str,
        bytes: &[u8],
        digest: &str,
        precompiled: Option<&[u8]>,
    ) -> Result<Component, PolicyError> {
        let mut compiled = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(component) = compiled.get(digest) {
            return Ok(component.clone());
        }
        if let Some(artifact) = precompiled {
            // SAFETY: the artifact is the one `build.rs` precompiled from these very bytes with
            // the same engine configuration and wasmtime; wasmtime checks its header and
            // compatibility with this engine and host before use.
            match unsafe { Component::deserialize(&self.engine, artifact) } {
                Ok(component) => {
                    compiled.insert(digest.to_string(), component.clone());
                    return Ok(component);
                }
                Err(e) => tracing::debug!(
                    "the embedded precompiled policy does not suit this host: {e:#}"
                ),
            }
        }
        let component = self.compile_or_load_artifact(label, bytes, digest)?;
        compiled.insert(digest.to_string(), component.clone());
        Ok(component)
    }

    fn compile_or_load_artifact(
        &self,
        label: &str,
        bytes: &[u8],
        digest: &str,
    ) -> Result<Component, PolicyError> {
        let invalid = |e: wasmtime::Error| PolicyError::Invalid {
            policy: label.to_string(),
            reason: format!("{e:#}"),
        };
        let compile = || {
            // Before compiling, which takes seconds: a component needing what the sandbox lacks
            // is refused at once. (A cached artifact passed this when it was compiled.)
            if let Some(reason) = super::imports::refusal(bytes) {
                return Err(PolicyError::NotAPolicy {
                    policy: label.to_string(),
                    reason,
                });
            }
            self.compilations.fetch_add(1, Ordering::Relaxed);
            Component::new(&self.engine, bytes).map_err(invalid)
        };
        let Some(path) = self.artifact_path(digest) else {
            return compile();
        };
        // Read into memory rather than mapping the file: a file changed under a live mapping
        // would crash the host.
        if let Ok(artifact) = std::fs::read(&path) {
            // SAFETY: the artifact was written by `Component::serialize` of this same engine
            // configuration (the compatibility hash is part of the path) into our own cache dir;
            // wasmtime checks its header and compatibility before use.
            match unsafe { Component::deserialize(&self.engine, &artifact) } {
                Ok(component) => return Ok(component),
                Err(e) => {
                    tracing::warn!(path = %path.display(), "ignoring unusable cached policy artifact: {e:#}")
                }
            }
        }
        let component = compile()?;
        if let Err(e) = store_artifact(&path, &component) {
            tracing::warn!(path = %path.display(), "could not cache compiled policy: {e:#}");
        }
        Ok(component)
    }

    fn artifact_path(&self, digest: &str) -> Option<PathBuf> {
        let dir = self.cache_dir.as_ref()?;
        let mut hasher = std::hash::DefaultHasher::new();
        self.engine
            .precompile_compatibility_hash()
            .hash(&mut hasher);
        Some(
            dir.join(format!("{:016x}", hasher.finish()))
                .join(format!("{digest}.cwasm")),
        )
    }
}

/// The version of `wasi:io` wasmtime-wasi defines (guests importing any 0.2.x link to it).
const WASI_IO_STREAMS: &str = "wasi:io/streams@0.2.12";

/// Replaces the output-stream functions a guest's stdout and stderr use (`blocking-write-and-flush`,
/// `blocking-flush`, dropping the stream) with ones that never block on tokio. wasmtime-wasi's
/// sync bindings run them through `Handle::block_on`, which panics on a tokio worker, where
/// inline decisions run. A policy's only streams are its stdout and stderr, whose writes are
/// synchronous ([`super::guest_output::GuestOutput`]), so nothing here needs to wait.
fn output_streams_on_any_thread(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    use wasmtime::component::{Resource, ResourceType};
    use wasmtime_wasi::p2::DynOutputStream;
    use wasmtime_wasi::p2::bindings::sync::io::streams::StreamError;

    fn write(stream: &mut DynOutputStream, bytes: Vec<u8>) -> Result<(), StreamError> {
        let written = stream.write(bytes.into()).and_then(|()| stream.flush());
        written.map_err(|_| StreamError::Closed)
    }

    linker.allow_shadowing(true);
    let mut streams = linker.instance(WASI_IO_STREAMS)?;
    streams.resource(
        "output-stream",
        ResourceType::host::<DynOutputStream>(),
        |mut store, rep| {
            let table = store.data_mut().table();
            table.delete(Resource::<DynOutputStream>::new_own(rep))?;
            Ok(())
        },
    )?;
    streams.func_wrap(
        "[method]output-stream.blocking-write-and-flush",
        |mut store, (stream, bytes): (Resource<DynOutputStream>, Vec<u8>)| {
            let table = store.data_mut().table();
            Ok((write(table.get_mut(&stream)?, bytes),))
        },
    )?;
    streams.func_wrap(
        "[method]output-stream.blocking-flush",
        |mut store, (stream,): (Resource<DynOutputStream>,)| {
            let table = store.data_mut().table();
            let stream = table.get_mut(&stream)?;
            Ok((stream.flush().map_err(|_| StreamError::Closed),))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

fn store_artifact(path: &Path, component: &Component) -> anyhow::Result<()> {
    let dir = path.parent().expect("artifact paths have a parent");
    std::fs::create_dir_all(dir)?;
    let bytes = component.serialize()?;
    // Write then rename, so a concurrent reader never sees half a file; the temporary name is
    // unique to this process and this write (engines in several threads share a cache).
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let write = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{}-{write}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Finds the `tether:policy/policy@X` export and the contract line of X this host speaks.
fn contract_version(
    engine: &Engine,
    component: &Component,
    label: &str,
) -> Result<(semver::Version, Contract), PolicyError> {
    let prefix = format!("{CONTRACT_PACKAGE}/policy@");
    let ty = component.component_type();
    let mut exports = Vec::new();
    for (name, item) in ty.exports(engine) {
        if let (Some(version), ComponentItem::ComponentInstance(_)) =
            (name.strip_prefix(&prefix), item.ty)
        {
            let found = semver::Version::parse(version).map_err(|e| PolicyError::NotAPolicy {
                policy: label.to_string(),
                reason: format!("bad contract version {version:?}: {e}"),
            })?;
            let Some(contract) = Contract::of(&found) else {
                return Err(PolicyError::Incompatible {
                    policy: label.to_string(),
                    found: found.to_string(),
                });
            };
            return Ok((found, contract));
        }
        exports.push(name.to_string());
    }
    Err(PolicyError::NotAPolicy {
        policy: label.to_string(),
        reason: format!(
            "it does not export {CONTRACT_PACKAGE}/policy (it exports: {})",
            if exports.is_empty() {
                "nothing".to_string()
            } else {
                exports.join(", ")
            }
        ),
    })
}

impl std::fmt::Debug for LoadedPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPolicy")
            .field("label", &self.label)
            .field("digest", &self.digest)
            .field("contract", &self.version)
            .finish_non_exhaustive()
    }
}

/// A compiled, vetted policy component, ready to instantiate.
pub struct LoadedPolicy {
    engine: Arc<PolicyEngine>,
    pre: Box<dyn Prepared>,
    label: String,
    digest: String,
    version: semver::Version,
    contract: Contract,
}

impl LoadedPolicy {
    /// The wasmtime engine it was compiled for.
    pub fn engine(&self) -> &Engine {
        &self.engine.engine
    }

    /// The component, ready to instantiate in the bindings of its contract line.
    pub(crate) fn pre(&self) -> &dyn Prepared {
        &*self.pre
    }

    /// The contract line the component speaks.
    pub fn contract(&self) -> Contract {
        self.contract
    }

    /// Where it came from, for messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// SHA-256 of the component bytes.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The contract version the component was built against.
    pub fn contract_version(&self) -> &semver::Version {
        &self.version
    }

    pub(crate) fn fault(&self, during: &'static str, fault: PolicyFault) -> PolicyError {
        PolicyError::Fault {
            policy: self.label.clone(),
            during,
            fault,
        }
    }

    pub(crate) fn refused(&self, what: &'static str, reason: String) -> PolicyError {
        PolicyError::Refused {
            policy: self.label.clone(),
            what,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::bindings::compatible;

    #[test]
    fn newer_minor_of_the_same_line_is_compatible_older_and_other_lines_are_not() {
        let v = |s| semver::Version::parse(s).unwrap();
        assert!(compatible(&v("0.1.0"), &v("0.1.0")));
        assert!(compatible(&v("0.1.0"), &v("0.1.7")));
        assert!(!compatible(&v("0.1.0"), &v("0.2.0")));
        assert!(!compatible(&v("0.1.0"), &v("1.0.0")));
        assert!(!compatible(&v("0.1.3"), &v("0.1.2")));
        assert!(compatible(&v("1.2.0"), &v("1.5.0")));
        assert!(!compatible(&v("1.2.0"), &v("2.0.0")));
    }

    #[test]
    fn each_line_this_host_speaks_is_recognized_and_others_are_not() {
        use super::super::bindings::Contract;
        let v = |s| semver::Version::parse(s).unwrap();
        assert_eq!(Contract::of(&v("0.1.0")), Some(Contract::V0_1));
        assert_eq!(Contract::of(&v("0.1.1")), Some(Contract::V0_1));
        assert_eq!(Contract::of(&v("0.2.0")), Some(Contract::V0_2));
        assert_eq!(Contract::of(&v("0.3.0")), None);
        assert_eq!(Contract::of(&v("1.0.0")), None);
        assert_eq!(super::super::bindings::CONTRACT_VERSIONS[0], "0.2.0");
    }
}
