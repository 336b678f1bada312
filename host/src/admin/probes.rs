//! Probes for an orchestrator (Kubernetes and the like), without a token, on a listener of
//! their own: `GET /livez` (the process answers), `GET /readyz` (the config is loaded and the
//! policy answers; optionally, every server is connected too) and, when asked, `GET /metrics`.
//! They say nothing a token protects: states and counts, never configs or faults' words.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::metrics::Metrics;
use crate::policy::ServerState;
use crate::supervisor::Supervisor;

/// What the probe listener serves.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// The address (port 0: any free port; see `Tether::probe_addr`).
    pub bind: SocketAddr,
    /// Also serve `GET /metrics` there, without the admin token.
    pub metrics: bool,
    /// Ready only while every configured server is connected (default: the gateway is ready
    /// once its config is loaded and its policy answers, whatever its upstreams do).
    pub ready_requires_servers: bool,
}

/// The probe listener, while it runs.
pub struct ProbeServer {
    /// The address it listens on (the real port when bound to port 0).
    pub addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl ProbeServer {
    /// Stops listening.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.task).await;
    }
}

#[derive(Clone)]
struct Probes {
    supervisor: Supervisor,
    metrics: Arc<Metrics>,
    options: ProbeOptions,
}

/// Starts the probe listener.
pub async fn start(
    options: ProbeOptions,
    supervisor: Supervisor,
    metrics: Arc<Metrics>,
) -> std::io::Result<ProbeServer> {
    let listener = tokio::net::TcpListener::bind(options.bind).await?;
    let addr = listener.local_addr()?;
    let mut router = Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(ready));
    if options.metrics {
        router = router.route("/metrics", get(metrics_text));
    }
    let router = router.with_state(Probes {
        supervisor,
        metrics,
        options,
    });
    let (shutdown, mut stopping) = watch::channel(false);
    let task = tokio::spawn(async move {
        let service = router.into_make_service();
        let served = axum::serve(listener, service).with_graceful_shutdown(async move {
            let _ = stopping.wait_for(|stop| *stop).await;
        });
        if let Err(error) = served.await {
            tracing::error!("the probe listener stopped: {error}");
        }
    });
    tracing::info!(%addr, "probes listening (/livez, /readyz)");
    Ok(ProbeServer {
        addr,
        shutdown,
        task,
    })
}

/// How long the policy has to answer a readiness probe.
const POLICY_ANSWERS_WITHIN: Duration = Duration::from_secs(2);

async fn ready(State(probes): State<Probes>) -> Response {
    let policy = tokio::time::timeout(POLICY_ANSWERS_WITHIN, probes.supervisor.policy().status())
        .await
        .is_ok_and(|answer| answer.is_ok());
    let states: Vec<ServerState> = probes
        .supervisor
        .views()
        .into_iter()
        .map(|view| view.state)
        .collect();
    match readiness(policy, probes.options.ready_requires_servers, &states) {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()).into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

/// Whether the gateway is ready, sans IO: the policy answered and, when required, every server
/// is connected.
fn readiness(
    policy_answers: bool,
    require_servers: bool,
    states: &[ServerState],
) -> Result<(), String> {
    if !policy_answers {
        return Err("the policy does not answer".into());
    }
    if require_servers {
        let waiting = states
            .iter()
            .filter(|state| !matches!(state, ServerState::Connected | ServerState::Healthy))
            .count();
        if waiting > 0 {
            return Err(format!(
                "{waiting} of {} servers are not connected",
                states.len()
            ));
        }
    }
    Ok(())
}

async fn metrics_text(State(probes): State<Probes>) -> Response {
    super::server::metrics_response(&probes.metrics, &probes.supervisor).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_the_policy_answers_and_servers_count_only_when_asked() {
        use ServerState::*;
        let states = [Healthy, BackingOff, Connected];
        assert!(readiness(true, false, &states).is_ok());
        assert_eq!(
            readiness(true, true, &states),
            Err("1 of 3 servers are not connected".into())
        );
        assert!(readiness(true, true, &[Healthy, Connected]).is_ok());
        assert!(readiness(false, false, &[]).is_err());
    }
}
