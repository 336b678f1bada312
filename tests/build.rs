//! Builds the test policy components (guest/test-policies) for the integration tests.

fn main() {
    tether_wasm_build::rerun_if_changed(&["guest", "wit", "Cargo.lock"]);
    let packages = [
        ("TETHER_TEST_POLICY_HOSTILE", "tether-policy-hostile"),
        ("TETHER_TEST_POLICY_WRONG", "tether-policy-wrong"),
        ("TETHER_TEST_POLICY_NEXT_MINOR", "tether-policy-next-minor"),
        (
            "TETHER_TEST_POLICY_PREVIOUS_MINOR",
            "tether-policy-previous-minor",
        ),
        ("TETHER_TEST_POLICY_OTHER", "tether-policy-other"),
        (
            "TETHER_TEST_POLICY_INCOMPATIBLE",
            "tether-policy-incompatible",
        ),
        (
            "TETHER_TEST_POLICY_FIXED_INTERVAL",
            "tether-policy-fixed-interval",
        ),
        ("TETHER_TEST_POLICY_GIVES_UP", "tether-policy-gives-up"),
        (
            "TETHER_TEST_POLICY_REPUBLISHES",
            "tether-policy-republishes",
        ),
        ("TETHER_TEST_POLICY_MUTANT", "tether-policy-mutant"),
    ];
    let names: Vec<&str> = packages.iter().map(|(_, package)| *package).collect();
    let paths = tether_wasm_build::build_components(&names);
    for ((var, _), path) in packages.iter().zip(paths) {
        println!("cargo:rustc-env={var}={}", path.display());
    }
}
