//! Prometheus metrics for the admin API's `GET /metrics`.
//!
//! Two kinds of series:
//! - tool calls, observed as they finish ([`Metrics::observe_call`]; the call path reaches it
//!   through [`CallObserver`], registered with [`Supervisor::observe_calls`]):
//!   `tether_tool_calls_total{server,tool,outcome}` and
//!   `tether_tool_call_duration_seconds{server,tool}` (`tool`: its name on the server);
//! - everything else, read from the supervisor and the policy runtime at scrape time
//!   ([`Metrics::render`]): per-server state, tools, reconnects, parks and breaker state, and the
//!   policy runtime's counters, and what hostile upstreams sent that was dropped (notifications
//!   over the rate, oversized messages, invalid tools); `tether_build_info`; and the usual
//!   `process_*` series (CPU, memory, file descriptors, start time, from `/proc`).
//!
//! The breaker is exposed as its current state (`tether_server_breaker{server,state}`), not as a
//! count of openings: the policy owns the breaker and reports only its state, so a count sampled
//! at scrape time would miss short openings.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{OnceLock, RwLock};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::calls::{CallObserver, CallResultKind};
use crate::policy::{BreakerState, ServerState};
use crate::supervisor::Supervisor;

/// The `Content-Type` of [`Metrics::render`]'s output (Prometheus text format 0.0.4).
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

impl EncodeLabelValue for CallResultKind {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

/// The call path reports every finished call here (see [`Supervisor::observe_calls`]).
impl CallObserver for Metrics {
    fn observe(&self, server: &str, tool: &str, result: CallResultKind, duration: Duration) {
        self.observe_call(server, tool, result, duration);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CallLabels {
    server: String,
    tool: String,
    outcome: CallResultKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ToolLabels {
    server: String,
    tool: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ServerLabel {
    server: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ServerStateLabels {
    server: String,
    state: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ServerTransportLabels {
    server: String,
    transport: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PolicyLabels {
    label: String,
    name: String,
    version: String,
    contract: String,
    digest: String,
}

/// Upper bounds (seconds) of the call latency histogram: 5 ms to the default 300 s deadline.
const CALL_BUCKETS: [f64; 15] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

fn call_histogram() -> Histogram {
    Histogram::new(CALL_BUCKETS)
}

/// What build serves: `tether_build_info`'s labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct BuildInfo {
    /// The version.
    pub version: String,
    /// The commit it was built from (`unknown` when the builder does not say).
    pub commit: String,
    /// The target triple.
    pub target: String,
    /// The wasmtime version policies run on.
    pub wasmtime: String,
}

impl Default for BuildInfo {
    fn default() -> Self {
        Self {
            version: env!("CARGO_PKG_VERSION").to_string(),
            commit: "unknown".to_string(),
            target: "unknown".to_string(),
            wasmtime: "unknown".to_string(),
        }
    }
}

/// One tool's call series, taken from the families once: a call then counts itself without
/// building (and allocating) its labels.
struct ToolSeries {
    /// By outcome ([`CallResultKind`] as an index), created on the first call that ends so.
    calls: [OnceLock<Counter>; OUTCOMES],
    /// Created by the first call that was sent (a refused one has no duration).
    duration: OnceLock<Histogram>,
}

const OUTCOMES: usize = 6;

/// Where an outcome's counter sits in [`ToolSeries::calls`] (a new outcome fails to compile here).
fn outcome_index(outcome: CallResultKind) -> usize {
    match outcome {
        CallResultKind::Ok => 0,
        CallResultKind::ToolError => 1,
        CallResultKind::TransportError => 2,
        CallResultKind::Timeout => 3,
        CallResultKind::Refused => 4,
        CallResultKind::Cancelled => 5,
    }
}

/// Keyed by server, then tool: looked up with the call's `&str`s.
type SeriesMap = HashMap<String, HashMap<String, ToolSeries, Hasher>, Hasher>;
type Hasher = foldhash::fast::RandomState;

/// The gateway's metrics. Cheap to share (`Arc<Metrics>`); observing never blocks on I/O.
pub struct Metrics {
    calls: Family<CallLabels, Counter>,
    durations: Family<ToolLabels, Histogram, fn() -> Histogram>,
    series: RwLock<SeriesMap>,
    build: BuildInfo,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Every server state, in WIT order, with its name in the `state` label.
const STATES: [ServerState; 6] = [
    ServerState::Connecting,
    ServerState::Connected,
    ServerState::Healthy,
    ServerState::BackingOff,
    ServerState::Parked,
    ServerState::Stopped,
];

const BREAKER_STATES: [BreakerState; 3] = [
    BreakerState::Closed,
    BreakerState::Open,
    BreakerState::HalfOpen,
];

/// A server state's name as the WIT spells it (`backing-off`); used by the admin API too.
pub fn state_name(state: ServerState) -> &'static str {
    match state {
        ServerState::Connecting => "connecting",
        ServerState::Connected => "connected",
        ServerState::Healthy => "healthy",
        ServerState::BackingOff => "backing-off",
        ServerState::Parked => "parked",
        ServerState::Stopped => "stopped",
    }
}

/// A breaker state's name as the WIT spells it (`half-open`).
pub fn breaker_name(state: BreakerState) -> &'static str {
    match state {
        BreakerState::Closed => "closed",
        BreakerState::Open => "open",
        BreakerState::HalfOpen => "half-open",
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self::with_build(BuildInfo::default())
    }

    /// Metrics whose `tether_build_info` says `build`.
    pub fn with_build(build: BuildInfo) -> Self {
        Self {
            calls: Family::default(),
            durations: Family::new_with_constructor(call_histogram as fn() -> Histogram),
            series: RwLock::default(),
            build,
        }
    }

    /// Counts one finished call of `server`'s `tool` and, unless Tether refused to send it,
    /// its duration (from admission to the answer, retries on a fresh session included).
    pub fn observe_call(
        &self,
        server: &str,
        tool: &str,
        outcome: CallResultKind,
        duration: Duration,
    ) {
        let observe = |series: &ToolSeries| {
            series.calls[outcome_index(outcome)]
                .get_or_init(|| {
                    self.calls
                        .get_or_create(&CallLabels {
                            server: server.to_string(),
                            tool: tool.to_string(),
                            outcome,
                        })
                        .clone()
                })
                .inc();
            if outcome != CallResultKind::Refused {
                series
                    .duration
                    .get_or_init(|| {
                        self.durations
                            .get_or_create(&ToolLabels {
                                server: server.to_string(),
                                tool: tool.to_string(),
                            })
                            .clone()
                    })
                    .observe(duration.as_secs_f64());
            }
        };
        let known = self.series.read().unwrap_or_else(|e| e.into_inner());
        if let Some(series) = known.get(server).and_then(|tools| tools.get(tool)) {
            return observe(series);
        }
        drop(known);
        let mut known = self.series.write().unwrap_or_else(|e| e.into_inner());
        let series = known
            .entry(server.to_string())
            .or_default()
            .entry(tool.to_string())
            .or_insert_with(|| ToolSeries {
                calls: Default::default(),
                duration: OnceLock::new(),
            });
        observe(series);
    }

    /// Every series in the Prometheus text format ([`CONTENT_TYPE`]).
    pub async fn render(&self, supervisor: &Supervisor) -> String {
        let views = supervisor.views();
        let statuses = supervisor.policy_status().await;
        let mut registry = Registry::with_prefix("tether");

        let state = Family::<ServerStateLabels, Gauge>::default();
        let transport = Family::<ServerTransportLabels, Gauge>::default();
        let tools = Family::<ServerLabel, Gauge>::default();
        let reconnects = Family::<ServerLabel, Counter>::default();
        let parks = Family::<ServerLabel, Counter>::default();
        let breaker = Family::<ServerStateLabels, Gauge>::default();
        let breaker_failures = Family::<ServerLabel, Gauge>::default();
        let failures = Family::<ServerLabel, Gauge>::default();
        for view in &views {
            let server = || view.name.clone();
            for s in STATES {
                state
                    .get_or_create(&ServerStateLabels {
                        server: server(),
                        state: state_name(s),
                    })
                    .set(i64::from(view.state == s));
            }
            transport
                .get_or_create(&ServerTransportLabels {
                    server: server(),
                    transport: crate::transport::kind_name(view.transport),
                })
                .set(1);
            let label = ServerLabel { server: server() };
            tools
                .get_or_create(&label)
                .set(supervisor.registry().server_tools(&view.name).len() as i64);
            reconnects.get_or_create(&label).inc_by(view.reconnects);
            parks.get_or_create(&label).inc_by(view.parks);
            if let Some(status) = statuses.iter().find(|s| s.server == view.name) {
                for b in BREAKER_STATES {
                    breaker
                        .get_or_create(&ServerStateLabels {
                            server: server(),
                            state: breaker_name(b),
                        })
                        .set(i64::from(status.breaker == b));
                }
                breaker_failures
                    .get_or_create(&label)
                    .set(i64::from(status.breaker_failures));
                failures
                    .get_or_create(&label)
                    .set(i64::from(status.failures));
            }
        }
        registry.register(
            "server_state",
            "1 for the state each server is in now, 0 for the others",
            state,
        );
        registry.register(
            "server_transport",
            "The transport each server is reached by (always 1)",
            transport,
        );
        registry.register(
            "server_tools",
            "Tools of each server visible to agents now",
            tools,
        );
        registry.register(
            "server_reconnects",
            "Connection attempts started for each server (first connect included)",
            reconnects,
        );
        registry.register(
            "server_parks",
            "Times each server was parked (retry budget exhausted or a permanent fault)",
            parks,
        );
        registry.register(
            "server_breaker",
            "1 for the state each server's circuit breaker is in now, 0 for the others",
            breaker,
        );
        registry.register(
            "server_breaker_failures",
            "Consecutive transport failures the breaker of each server counts now",
            breaker_failures,
        );
        registry.register(
            "server_failures",
            "Consecutive failed connection attempts of each server without a proven session",
            failures,
        );

        registry.register(
            "tool_calls",
            "Tool calls finished, by server, tool and outcome",
            self.calls.clone(),
        );
        registry.register(
            "tool_call_duration_seconds",
            "Duration of tool calls that were sent (refused calls excluded), by server and tool",
            self.durations.clone(),
        );

        let policy = supervisor.policy();
        let running = policy.running();
        let info = Family::<PolicyLabels, Gauge>::default();
        info.get_or_create(&PolicyLabels {
            label: running.label,
            name: running.name,
            version: running.version,
            contract: running.contract,
            digest: running.digest,
        })
        .set(1);
        registry.register("policy_info", "The running policy (always 1)", info);
        let stats = policy.stats();
        let counter = |value: u64| {
            let counter = Counter::<u64>::default();
            counter.inc_by(value);
            counter
        };
        registry.register(
            "policy_decisions",
            "Inputs the policy handled (events, admissions, status requests)",
            counter(stats.decisions.load(Ordering::Relaxed)),
        );
        let seconds = Counter::<f64>::default();
        seconds.inc_by(stats.decision_nanos.load(Ordering::Relaxed) as f64 / 1e9);
        registry.register(
            "policy_decision_seconds",
            "Time the policy spent handling inputs",
            seconds,
        );
        registry.register(
            "policy_faults",
            "Guest calls that failed (trap, fuel, memory, invalid output)",
            counter(stats.faults.load(Ordering::Relaxed)),
        );
        registry.register(
            "policy_recoveries",
            "Failed policy instances restored to their last good state",
            counter(stats.recoveries.load(Ordering::Relaxed)),
        );
        registry.register(
            "policy_fallbacks",
            "Times the embedded default policy replaced a failing one",
            counter(stats.fallbacks.load(Ordering::Relaxed)),
        );
        registry.register(
            "policy_swaps",
            "Policy swaps by operators",
            counter(stats.swaps.load(Ordering::Relaxed)),
        );
        registry.register(
            "policy_inline_misses",
            "Decisions begun on a caller's thread and finished on the policy thread",
            counter(stats.inline_misses.load(Ordering::Relaxed)),
        );
        registry.register(
            "policy_redundant_actions",
            "Tool actions of the policy that changed nothing and were absorbed: a withdrawal of tools not shown, a publication identical to the one shown",
            counter(supervisor.redundant_actions()),
        );
        registry.register(
            "registry_generation",
            "Changes of the visible tool set so far",
            counter(supervisor.registry().generation()),
        );

        // What hostile or broken upstreams sent that Tether would not take.
        registry.register(
            "upstream_notifications_dropped",
            "Upstream notifications dropped because a server sent more than the rate allows",
            counter(crate::transport::gate::dropped_notifications()),
        );
        let (oversized_answers, oversized_dropped) = crate::transport::limit::oversized_counts();
        registry.register(
            "upstream_oversized_answers",
            "Upstream answers larger than max_message, failed as too large",
            counter(oversized_answers),
        );
        registry.register(
            "upstream_oversized_dropped",
            "Other upstream messages larger than max_message, dropped",
            counter(oversized_dropped),
        );
        registry.register(
            "calls_resent",
            "Tool calls sent again on a fresh session because their first try provably never ran",
            counter(crate::calls::resent_calls()),
        );
        registry.register(
            "upstream_invalid_tools",
            "Tools skipped from tools/list answers because they were invalid (no or empty name)",
            counter(crate::upstream::invalid_tools_skipped()),
        );

        let build = Family::<BuildInfo, Gauge>::default();
        build.get_or_create(&self.build).set(1);
        registry.register("build_info", "The build serving (always 1)", build);

        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)
            .expect("writing to a String cannot fail");
        // The process's own series keep their usual names (no `tether_` prefix).
        let mut process = Registry::default();
        process_metrics(&mut process);
        prometheus_client::encoding::prometheus_text::encode(&mut text, &process)
            .expect("writing to a String cannot fail");
        text
    }
}

/// The usual `process_*` series, read from `/proc` (none elsewhere): CPU time, memory, open
/// file descriptors, start time.
fn process_metrics(registry: &mut Registry) {
    use prometheus_client::metrics::gauge::Gauge as FloatGauge;
    let Some(stat) = std::fs::read_to_string("/proc/self/stat").ok() else {
        return;
    };
    // Fields after the command name (which may hold spaces), from field 3 on.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |number: usize| -> f64 {
        fields
            .get(number - 3)
            .and_then(|f| f.parse().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf only reads configuration values.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK) as f64,
            libc::sysconf(libc::_SC_PAGESIZE) as f64,
        )
    };
    if ticks <= 0.0 {
        return;
    }
    let cpu = Counter::<f64, std::sync::atomic::AtomicU64>::default();
    cpu.inc_by((field(14) + field(15)) / ticks);
    registry.register(
        "process_cpu_seconds",
        "User and system CPU time spent, in seconds",
        cpu,
    );
    let resident = Gauge::<i64>::default();
    resident.set((field(24) * page) as i64);
    registry.register(
        "process_resident_memory_bytes",
        "Resident memory size, in bytes",
        resident,
    );
    let virtual_memory = Gauge::<i64>::default();
    virtual_memory.set(field(23) as i64);
    registry.register(
        "process_virtual_memory_bytes",
        "Virtual memory size, in bytes",
        virtual_memory,
    );
    let fds = Gauge::<i64>::default();
    fds.set(std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count() as i64));
    registry.register("process_open_fds", "Open file descriptors", fds);
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("btime "))
                .and_then(|value| value.trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    let start = FloatGauge::<f64, std::sync::atomic::AtomicU64>::default();
    start.set(boot + field(22) / ticks);
    registry.register(
        "process_start_time_seconds",
        "Start time of the process since the Unix epoch, in seconds",
        start,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_labels_match_their_names() {
        for (label, name) in [
            (CallResultKind::Ok, "ok"),
            (CallResultKind::ToolError, "tool_error"),
            (CallResultKind::TransportError, "transport_error"),
            (CallResultKind::Timeout, "timeout"),
            (CallResultKind::Refused, "refused"),
            (CallResultKind::Cancelled, "cancelled"),
        ] {
            assert_eq!(label.as_str(), name);
            let calls = Family::<CallLabels, Counter>::default();
            calls
                .get_or_create(&CallLabels {
                    server: "s".into(),
                    tool: "t".into(),
                    outcome: label,
                })
                .inc();
            let mut registry = Registry::default();
            registry.register("c", "c", calls);
            let mut text = String::new();
            prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
            assert!(
                text.contains(&format!(
                    "c_total{{server=\"s\",tool=\"t\",outcome=\"{name}\"}} 1"
                )),
                "{text}"
            );
        }
    }
}
