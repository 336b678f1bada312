// The wasmtime configuration of every policy engine. `build.rs` includes this file to precompile
// the embedded policy, so both must stay one definition: an artifact from a different
// configuration is refused at load (and the policy compiled instead).

/// The configuration every policy engine uses.
pub fn engine_config() -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config.consume_fuel(true);
    config.wasm_component_model(true);
    config
}
