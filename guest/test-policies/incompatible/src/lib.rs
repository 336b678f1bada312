//! A component for an incompatible contract version (tether:policy@0.3.0); hosts must refuse it.

#[allow(clippy::all)]
mod bindings {
    wit_bindgen::generate!({ path: "wit", world: "policy-component" });
}

struct Incompatible;

impl bindings::exports::tether::policy::policy::Guest for Incompatible {
    fn info() -> String {
        "incompatible-test-policy".into()
    }
}

bindings::export!(Incompatible with_types_in bindings);
