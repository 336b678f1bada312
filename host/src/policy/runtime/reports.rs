//! What the runtime tells the rest of the host: notices for operators, counters for metrics,
//! and a description of the policy that runs.

use std::sync::atomic::AtomicU64;

use crate::policy::engine::LoadedPolicy;
use crate::policy::types::PolicyInfo;

/// Something operators should hear about.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum PolicyNotice {
    /// A guest call failed; `error` names the policy and the fault.
    Fault {
        /// The failing policy's label.
        policy: String,
        /// The error, in words.
        error: String,
    },
    /// A fresh instance of the same policy was restored to the last good state.
    Recovered {
        /// The policy's label.
        policy: String,
    },
    /// The embedded default policy replaced a failing one.
    FellBack {
        /// The label of the policy that failed.
        from: String,
        /// Why it was replaced.
        reason: String,
    },
    /// An operator swapped the policy.
    Swapped {
        /// The outgoing policy's label.
        from: String,
        /// The incoming policy's label.
        to: String,
    },
    /// An operator changed the settings.
    SettingsChanged {
        /// The new settings, as a JSON object.
        settings: String,
    },
    /// A candidate policy runs beside the live one, acting on nothing.
    ShadowStarted {
        /// The shadow policy's label.
        policy: String,
    },
    /// The shadow policy decided otherwise than the live one (first time on this server).
    ShadowDiverged {
        /// The shadow policy's label.
        policy: String,
        /// The server the decision was about.
        server: String,
        /// What diverged (`"<event> actions"` or `"admission"`).
        decision: String,
    },
    /// The shadow policy failed and was dropped.
    ShadowDropped {
        /// The shadow policy's label.
        policy: String,
        /// Why it was dropped.
        reason: String,
    },
}

/// Counters for metrics.
#[derive(Debug, Default)]
pub struct RuntimeStats {
    /// Guest faults contained.
    pub faults: AtomicU64,
    /// Faulted instances rebuilt from the last good state.
    pub recoveries: AtomicU64,
    /// Times the embedded default policy replaced a failing one.
    pub fallbacks: AtomicU64,
    /// Policy swaps done.
    pub swaps: AtomicU64,
    /// Inputs the policy decided.
    pub decisions: AtomicU64,
    /// Time spent deciding them, in nanoseconds.
    pub decision_nanos: AtomicU64,
    /// Inline decisions handed to the policy thread (over budget, a fault, a panic).
    pub inline_misses: AtomicU64,
}

/// What is running now, for status displays.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunningPolicy {
    /// Where the component came from (its file, or `embedded`).
    pub label: String,
    /// The name the policy gives itself.
    pub name: String,
    /// The version the policy gives itself.
    pub version: String,
    /// The contract version it was built for.
    pub contract: String,
    /// SHA-256 of the component, hex.
    pub digest: String,
    /// Its settings, as given (JSON).
    pub settings: String,
}

impl RunningPolicy {
    /// `policy` as it introduced itself (`info`), running with `settings`.
    pub(super) fn describe(
        policy: &LoadedPolicy,
        info: Option<PolicyInfo>,
        settings: &str,
    ) -> Self {
        let (name, version) = info.map(|i| (i.name, i.version)).unwrap_or_default();
        Self {
            label: policy.label().to_string(),
            name,
            version,
            contract: policy.contract_version().to_string(),
            digest: policy.digest().to_string(),
            settings: settings.to_string(),
        }
    }
}
