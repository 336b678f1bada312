//! What a policy's wasmtime `Store` carries for the host: an empty WASI context (no files, no
//! environment, no network; stdout and stderr captured into the host log), the resource table,
//! the memory limits in force, and the policy's name for its log records.

use std::sync::Arc;

use wasmtime::component::ResourceTable;
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::guest_output::GuestOutput;
use super::types::LogLevel;

/// The state a policy `Store` carries.
pub struct StoreState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: StoreLimits,
    label: Arc<str>,
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl StoreState {
    /// A sandbox that can reach nothing, for the policy named `label`, with a memory cap.
    pub(crate) fn new(label: Arc<str>, memory_cap: usize) -> Self {
        let output = GuestOutput::new(label.clone());
        let wasi = WasiCtxBuilder::new()
            .stdout(output.clone())
            .stderr(output)
            .allow_ip_name_lookup(false)
            .allow_tcp(false)
            .allow_udp(false)
            .build();
        Self {
            wasi,
            table: ResourceTable::new(),
            limits: store_limits(memory_cap),
            label,
        }
    }

    /// The limits wasmtime's limiter consults.
    pub(crate) fn limits(&mut self) -> &mut StoreLimits {
        &mut self.limits
    }

    /// Moves the memory cap (the limiter reads the new limits on the next growth).
    pub(crate) fn set_memory_cap(&mut self, bytes: usize) {
        self.limits = store_limits(bytes);
    }

    /// The resource table, for host functions defined outside wasmtime-wasi.
    pub(crate) fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }

    /// A record the guest logs (through its contract's `log` import).
    pub(crate) fn write_log(&mut self, level: LogLevel, message: &str) {
        let policy = &*self.label;
        match level {
            LogLevel::Trace => tracing::trace!(target: "tether::policy", policy, "{message}"),
            LogLevel::Debug => tracing::debug!(target: "tether::policy", policy, "{message}"),
            LogLevel::Info => tracing::info!(target: "tether::policy", policy, "{message}"),
            LogLevel::Warn => tracing::warn!(target: "tether::policy", policy, "{message}"),
            LogLevel::Error => tracing::error!(target: "tether::policy", policy, "{message}"),
        }
    }
}

fn store_limits(memory_bytes: usize) -> StoreLimits {
    StoreLimitsBuilder::new()
        .memory_size(memory_bytes)
        .trap_on_grow_failure(true)
        .build()
}
