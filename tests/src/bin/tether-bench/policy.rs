//! Policy decision cost: the same events and admissions fed to the default policy as a wasm
//! component (direct guest calls, and through `PolicyRuntime` as the host does: inline, and
//! through the policy thread) and linked natively, interleaved batch by batch in one run.

use std::time::Instant;

use tether::policy::{
    self as host, Limits, PolicyEngine, PolicyInstance, PolicyRuntime, PolicySource, RuntimeOptions,
};
use tether_policy::Policy;
use tether_policy::model as native;

use crate::stats::Samples;
use crate::util::{ratio, table};

#[derive(clap::Parser)]
pub struct Args {
    /// Servers configured (and healthy) in the policy.
    #[arg(long, default_value_t = 10)]
    servers: usize,
    /// Batches per measurement (the median batch is reported).
    #[arg(long, default_value_t = 15)]
    batches: usize,
    /// Operations per batch.
    #[arg(long, default_value_t = 20_000)]
    ops: usize,
}

const NOW: u64 = 1_000_000;

/// The prepared inputs, as native model values.
struct Inputs {
    setup: Vec<native::Event>,
    keepalive: native::Event,
    call_ok: native::Event,
    disconnected: native::Event,
    connected: native::Event,
    request: native::CallRequest,
}

fn inputs(servers: usize) -> Inputs {
    let event = |kind| native::Event { now: NOW, kind };
    let tools: Vec<native::Tool> = ["echo", "add", "slow"]
        .iter()
        .map(|name| native::Tool {
            name: name.to_string(),
            read_only: false,
            revision: 1,
        })
        .collect();
    let session = |server: &str| native::SessionInfo {
        server: server.into(),
        server_info: "mcp-fixture 0.1.0".into(),
        tools: tools.clone(),
    };
    let mut setup = Vec::new();
    for i in 0..servers {
        let name = format!("s{i}");
        setup.push(event(native::EventKind::ServerConfigured(
            native::ServerConfig {
                name: name.clone(),
                transport: native::TransportKind::Stdio,
                include: vec![],
                exclude: vec![],
                settings: String::new(),
            },
        )));
        setup.push(event(native::EventKind::Connected(session(&name))));
        setup.push(event(native::EventKind::KeepaliveOk(name)));
    }
    Inputs {
        setup,
        keepalive: event(native::EventKind::KeepaliveOk("s0".into())),
        call_ok: event(native::EventKind::CallFinished(native::CallReport {
            server: "s0".into(),
            call_id: 1,
            outcome: native::CallOutcome::Ok,
            duration_ms: 1,
        })),
        disconnected: event(native::EventKind::Disconnected(native::ServerFault {
            server: "s0".into(),
            fault: native::Fault::ProcessExited(None),
        })),
        connected: event(native::EventKind::Connected(session("s0"))),
        request: native::CallRequest {
            now: NOW,
            call_id: 7,
            server: "s0".into(),
            tool: "echo".into(),
        },
    }
}

/// The host's generated types have the same shape and serde form as the guest's model.
fn to_host<T: serde::de::DeserializeOwned>(value: &impl serde::Serialize) -> T {
    serde_json::from_value(serde_json::to_value(value).unwrap()).expect("same shape")
}

/// One way of running the policy. `cycle` runs disconnect → timer → connected → keepalive.
trait Target {
    fn name(&self) -> &'static str;
    fn keepalive(&mut self);
    fn call_ok(&mut self);
    fn admit(&mut self);
    fn cycle(&mut self);
}

struct Native {
    policy: Policy,
    inputs: Inputs,
}

impl Target for Native {
    fn name(&self) -> &'static str {
        "native"
    }
    fn keepalive(&mut self) {
        std::hint::black_box(self.policy.handle(self.inputs.keepalive.clone()));
        self.policy.take_logs();
    }
    fn call_ok(&mut self) {
        std::hint::black_box(self.policy.handle(self.inputs.call_ok.clone()));
        self.policy.take_logs();
    }
    fn admit(&mut self) {
        let admission = self.policy.admit(self.inputs.request.clone());
        assert_eq!(admission, native::Admission::Allow);
        self.policy.take_logs();
    }
    fn cycle(&mut self) {
        let actions = self.policy.handle(self.inputs.disconnected.clone());
        let wake = actions
            .iter()
            .find_map(|a| match a {
                native::Action::WakeAt(w) => Some(w.clone()),
                _ => None,
            })
            .expect("a backoff timer");
        let timer = native::Event {
            now: wake.at,
            kind: native::EventKind::Timer(native::TimerFired {
                server: wake.server,
                token: wake.token,
            }),
        };
        let actions = self.policy.handle(timer);
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, native::Action::Connect(_))),
            "{actions:?}"
        );
        std::hint::black_box(self.policy.handle(self.inputs.connected.clone()));
        std::hint::black_box(self.policy.handle(self.inputs.keepalive.clone()));
        self.policy.take_logs();
    }
}

/// The wasm inputs, converted once.
struct HostInputs {
    keepalive: host::Event,
    call_ok: host::Event,
    disconnected: host::Event,
    connected: host::Event,
    request: host::CallRequest,
}

impl HostInputs {
    fn new(inputs: &Inputs) -> Self {
        Self {
            keepalive: to_host(&inputs.keepalive),
            call_ok: to_host(&inputs.call_ok),
            disconnected: to_host(&inputs.disconnected),
            connected: to_host(&inputs.connected),
            request: to_host(&inputs.request),
        }
    }
}

fn wake_of(actions: &[host::Action]) -> host::Event {
    let wake = actions
        .iter()
        .find_map(|a| match a {
            host::Action::WakeAt(w) => Some(w.clone()),
            _ => None,
        })
        .expect("a backoff timer");
    host::Event {
        now: wake.at,
        kind: host::EventKind::Timer(host::TimerFired {
            server: wake.server,
            token: wake.token,
        }),
    }
}

/// Direct synchronous guest calls: the pure decision cost through wasm.
struct Wasm {
    instance: PolicyInstance,
    inputs: HostInputs,
}

impl Target for Wasm {
    fn name(&self) -> &'static str {
        "wasm (direct)"
    }
    fn keepalive(&mut self) {
        std::hint::black_box(self.instance.handle(&self.inputs.keepalive).unwrap());
    }
    fn call_ok(&mut self) {
        std::hint::black_box(self.instance.handle(&self.inputs.call_ok).unwrap());
    }
    fn admit(&mut self) {
        let admission = self.instance.admit(&self.inputs.request).unwrap();
        assert_eq!(admission, host::Admission::Allow);
    }
    fn cycle(&mut self) {
        let actions = self.instance.handle(&self.inputs.disconnected).unwrap();
        let actions = self.instance.handle(&wake_of(&actions)).unwrap();
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, host::Action::Connect(_))),
            "{actions:?}"
        );
        std::hint::black_box(self.instance.handle(&self.inputs.connected).unwrap());
        std::hint::black_box(self.instance.handle(&self.inputs.keepalive).unwrap());
    }
}

/// Through `PolicyRuntime`, as the supervisor and call path use it: inline on the caller's
/// thread when it is free, or (with `inline_fuel: 0`) always through the policy thread.
struct Thread {
    runtime: PolicyRuntime,
    inputs: HostInputs,
    name: &'static str,
}

impl Target for Thread {
    fn name(&self) -> &'static str {
        self.name
    }
    fn keepalive(&mut self) {
        std::hint::black_box(
            self.runtime
                .handle(self.inputs.keepalive.clone())
                .wait()
                .unwrap(),
        );
    }
    fn call_ok(&mut self) {
        std::hint::black_box(
            self.runtime
                .handle(self.inputs.call_ok.clone())
                .wait()
                .unwrap(),
        );
    }
    fn admit(&mut self) {
        let admission = self
            .runtime
            .admit(self.inputs.request.clone())
            .wait()
            .unwrap();
        assert_eq!(admission, host::Admission::Allow);
    }
    fn cycle(&mut self) {
        let actions = self
            .runtime
            .handle(self.inputs.disconnected.clone())
            .wait()
            .unwrap();
        let actions = self.runtime.handle(wake_of(&actions)).wait().unwrap();
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, host::Action::Connect(_))),
            "{actions:?}"
        );
        std::hint::black_box(
            self.runtime
                .handle(self.inputs.connected.clone())
                .wait()
                .unwrap(),
        );
        std::hint::black_box(
            self.runtime
                .handle(self.inputs.keepalive.clone())
                .wait()
                .unwrap(),
        );
    }
}

type Op = fn(&mut dyn Target);

pub fn run(args: &Args) -> anyhow::Result<()> {
    println!(
        "\n## policy: decision cost ({} healthy servers, median of {} batches × {} ops)\n",
        args.servers, args.batches, args.ops
    );
    let engine = PolicyEngine::new(None)?;
    let loaded = engine.load(&PolicySource::Embedded)?;
    let native_inputs = inputs(args.servers);

    let mut policy = Policy::new("{}").map_err(anyhow::Error::msg)?;
    let mut instance = PolicyInstance::instantiate(&loaded, &Limits::default())?;
    instance.init("{}")?;
    let runtime = PolicyRuntime::start(RuntimeOptions {
        engine: Some(engine.clone()),
        ..RuntimeOptions::default()
    })?;
    let thread_only = PolicyRuntime::start(RuntimeOptions {
        engine: Some(engine.clone()),
        inline_fuel: 0,
        ..RuntimeOptions::default()
    })?;
    for event in &native_inputs.setup {
        policy.handle(event.clone());
        let host_event: host::Event = to_host(event);
        instance.handle(&host_event)?;
        runtime.handle(host_event.clone()).wait()?;
        thread_only.handle(host_event).wait()?;
    }
    policy.take_logs();
    let host_inputs = HostInputs::new(&native_inputs);
    let thread_inputs = HostInputs::new(&native_inputs);
    let thread_only_inputs = HostInputs::new(&native_inputs);
    let mut targets: Vec<Box<dyn Target>> = vec![
        Box::new(Native {
            policy,
            inputs: native_inputs,
        }),
        Box::new(Wasm {
            instance,
            inputs: host_inputs,
        }),
        Box::new(Thread {
            runtime,
            inputs: thread_inputs,
            name: "wasm (PolicyRuntime: inline)",
        }),
        Box::new(Thread {
            runtime: thread_only,
            inputs: thread_only_inputs,
            name: "wasm (PolicyRuntime: policy thread)",
        }),
    ];

    let ops: [(&str, Op, usize); 4] = [
        ("event: keepalive-ok", |t| t.keepalive(), 1),
        ("event: call-finished ok", |t| t.call_ok(), 1),
        ("admission (healthy server)", |t| t.admit(), 1),
        (
            "disconnect→timer→connected→keepalive (per event)",
            |t| t.cycle(),
            4,
        ),
    ];
    let mut rows = Vec::new();
    for (label, op, events_per_op) in ops {
        let mut per_target: Vec<Vec<u64>> = vec![Vec::new(); targets.len()];
        // The cycle is ~10× dearer; fewer ops keep the run short.
        let n = if events_per_op > 1 {
            args.ops / 10
        } else {
            args.ops
        };
        for batch in 0..=args.batches {
            for (i, target) in targets.iter_mut().enumerate() {
                let start = Instant::now();
                for _ in 0..n {
                    op(target.as_mut());
                }
                let per_event = start.elapsed().as_nanos() as u64 / (n * events_per_op) as u64;
                if batch > 0 {
                    // Batch 0 warms up.
                    per_target[i].push(per_event);
                }
            }
        }
        let medians: Vec<u64> = per_target
            .into_iter()
            .map(|s| Samples::new(s).median())
            .collect();
        for (i, target) in targets.iter().enumerate() {
            rows.push(vec![
                label.to_string(),
                target.name().to_string(),
                format!("{} ns", medians[i]),
                ratio(medians[i] as f64, medians[0] as f64),
            ]);
        }
    }
    table(
        &[
            "input",
            "runs as",
            "median ns per event/admission",
            "vs native",
        ],
        &rows,
    );
    println!("targets: wasm (direct) ≤ 1 µs median and ≤ 3× native\n");
    Ok(())
}
