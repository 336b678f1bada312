//! Builds the default policy (`guest/`) as a wasm component and embeds it in the host.

fn main() {
    tether_wasm_build::rerun_if_changed(&["guest", "wit", "Cargo.lock"]);
    let [default_policy] = tether_wasm_build::build_components(&["tether-default-policy"])
        .try_into()
        .expect("one component");
    println!(
        "cargo:rustc-env=TETHER_DEFAULT_POLICY_WASM={}",
        default_policy.display()
    );
}
