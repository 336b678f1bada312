//! A policy that misbehaves on purpose, to prove the host contains it. It runs the default
//! logic, and its settings may carry a `"hostile"` object choosing misdeeds:
//!
//! - `panic_on_event: N`  — panic on this instance's Nth `handle` call
//! - `loop_on_event: N`   — loop forever on the Nth `handle` call
//! - `grow_on_event: N`   — allocate until the memory cap on the Nth `handle` call
//! - `flood_on_event: N`  — return 50 000 actions on the Nth `handle` call
//! - `nonsense_on_event: N` — return actions about an unknown server and bad tool names
//! - `trap_in_restore: true` — panic in `restore`
//! - `print_from_event: N` — print to stdout and stderr on every `handle` call from the Nth on
//!
//! The call counter lives in the instance, not in snapshots: a fresh instance starts from zero.

use std::cell::Cell;

use serde_json::Value;
use tether_policy::Policy;
use tether_policy_sdk::PolicyLogic;
use tether_policy_sdk::model::{self, Action, StateChange};

thread_local! {
    static HANDLE_CALLS: Cell<u64> = const { Cell::new(0) };
    static MISDEEDS: Cell<Misdeeds> = const { Cell::new(Misdeeds::NONE) };
}

/// Which misdeeds are configured (`on_event` ones name the 1-based `handle` call).
#[derive(Clone, Copy, PartialEq)]
struct Misdeeds {
    panic_on_event: Option<u64>,
    loop_on_event: Option<u64>,
    grow_on_event: Option<u64>,
    flood_on_event: Option<u64>,
    nonsense_on_event: Option<u64>,
    trap_in_restore: bool,
    print_from_event: Option<u64>,
}

impl Misdeeds {
    const NONE: Misdeeds = Misdeeds {
        panic_on_event: None,
        loop_on_event: None,
        grow_on_event: None,
        flood_on_event: None,
        nonsense_on_event: None,
        trap_in_restore: false,
        print_from_event: None,
    };
}

/// Splits the `hostile` key off the settings, remembering the misdeeds.
fn take_misdeeds(settings: &str) -> Result<String, String> {
    let mut value: Value = if settings.trim().is_empty() {
        Value::Object(Default::default())
    } else {
        serde_json::from_str(settings).map_err(|e| e.to_string())?
    };
    let mut misdeeds = Misdeeds::NONE;
    if let Some(hostile) = value.as_object_mut().and_then(|o| o.remove("hostile")) {
        let Value::Object(fields) = hostile else {
            return Err("hostile must be an object".into());
        };
        for (key, setting) in fields {
            let n = setting.as_u64();
            match key.as_str() {
                "panic_on_event" => misdeeds.panic_on_event = n,
                "loop_on_event" => misdeeds.loop_on_event = n,
                "grow_on_event" => misdeeds.grow_on_event = n,
                "flood_on_event" => misdeeds.flood_on_event = n,
                "nonsense_on_event" => misdeeds.nonsense_on_event = n,
                "trap_in_restore" => misdeeds.trap_in_restore = setting.as_bool() == Some(true),
                "print_from_event" => misdeeds.print_from_event = n,
                other => return Err(format!("unknown hostile setting {other}")),
            }
        }
    }
    MISDEEDS.with(|m| m.set(misdeeds));
    Ok(value.to_string())
}

struct Hostile(Policy);

impl PolicyLogic for Hostile {
    fn info() -> model::PolicyInfo {
        model::PolicyInfo {
            name: "hostile-test-policy".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn create(settings_json: &str) -> Result<Self, String> {
        Ok(Hostile(Policy::new(&take_misdeeds(settings_json)?)?))
    }

    fn restore(snapshot: &[u8]) -> Result<Self, String> {
        if MISDEEDS.with(Cell::get).trap_in_restore {
            panic!("hostile policy: trapping in restore as configured");
        }
        Ok(Hostile(Policy::restore(snapshot)?))
    }

    fn set_settings(&mut self, settings_json: &str) -> Result<(), String> {
        self.0.set_settings(&take_misdeeds(settings_json)?)
    }

    fn handle(&mut self, event: model::Event) -> Vec<Action> {
        let call = HANDLE_CALLS.with(|c| {
            c.set(c.get() + 1);
            c.get()
        });
        let misdeeds = MISDEEDS.with(Cell::get);
        let now = |n: Option<u64>| n == Some(call);
        if misdeeds.print_from_event.is_some_and(|n| call >= n) {
            println!("hostile policy: printing on event {call}");
            eprintln!("hostile policy: printing to stderr on event {call}");
        }
        if now(misdeeds.panic_on_event) {
            panic!("hostile policy: panicking on event {call}");
        }
        if now(misdeeds.loop_on_event) {
            let mut spin = 0u64;
            loop {
                spin = std::hint::black_box(spin.wrapping_add(1));
            }
        }
        if now(misdeeds.grow_on_event) {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1u8; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        }
        if now(misdeeds.flood_on_event) {
            return (0..50_000)
                .map(|i| {
                    Action::StateChanged(StateChange {
                        server: format!("flood-{i}"),
                        state: model::ServerState::Connecting,
                        detail: String::new(),
                    })
                })
                .collect();
        }
        if now(misdeeds.nonsense_on_event) {
            return vec![
                Action::Connect("a server nobody configured".into()),
                Action::PublishTools(model::Publication {
                    server: "a server nobody configured".into(),
                    tools: vec![model::PublishedTool {
                        advertised: "not a valid name!".into(),
                        original: String::new(),
                        read_only: false,
                        revision: 0,
                    }],
                }),
            ];
        }
        self.0.handle(event)
    }

    fn admit(&mut self, request: model::CallRequest) -> model::Admission {
        self.0.admit(request)
    }

    fn status(&self, now: model::Millis) -> Vec<model::ServerStatus> {
        self.0.status_at(now)
    }

    fn take_over(&mut self, handover: model::Handover) -> Result<Vec<model::Action>, String> {
        self.0.take_over(handover)
    }

    fn snapshot(&self) -> Vec<u8> {
        self.0.snapshot()
    }

    fn take_logs(&mut self) -> Vec<(model::LogLevel, String)> {
        self.0.take_logs()
    }

    fn set_naming(&mut self, naming: model::Naming) {
        self.0.set_naming(naming)
    }

    fn name_prompts(&self, server: &str, originals: &[String]) -> Vec<model::NamedPrompt> {
        self.0.name_prompts(server, originals)
    }
}

tether_policy_sdk::export_policy_logic!(Hostile);
