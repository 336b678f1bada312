//! Builds the default policy (`guest/`) as a wasm component and embeds it in the host, together
//! with its precompiled artifact for this machine, so a first start need not compile it.

use std::path::PathBuf;

include!("src/policy/engine_config.rs");

fn main() {
    tether_wasm_build::rerun_if_changed(&["guest", "wit", "Cargo.lock"]);
    println!("cargo:rerun-if-changed=src/policy/engine_config.rs");
    let [default_policy] = tether_wasm_build::build_components(&["tether-default-policy"])
        .try_into()
        .expect("one component");
    println!(
        "cargo:rustc-env=TETHER_DEFAULT_POLICY_WASM={}",
        default_policy.display()
    );
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("default_policy.cwasm");
    std::fs::write(&out, precompile(&default_policy)).expect("write the precompiled policy");
    println!(
        "cargo:rustc-env=TETHER_DEFAULT_POLICY_CWASM={}",
        out.display()
    );
}

/// The component compiled for the machine that builds (empty when cross-compiling: the
/// artifact would not load on the target, which then compiles the component once).
fn precompile(component: &std::path::Path) -> Vec<u8> {
    if std::env::var("TARGET").ok() != std::env::var("HOST").ok() {
        return Vec::new();
    }
    let engine = wasmtime::Engine::new(&engine_config()).expect("a wasmtime engine");
    let bytes = std::fs::read(component).expect("read the built component");
    engine
        .precompile_component(&bytes)
        .expect("precompile the default policy")
}
