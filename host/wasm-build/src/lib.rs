//! Used by build scripts to build workspace crates as wasm32-wasip2 components with a nested
//! cargo. The nested cargo gets its own target dir (sharing the outer one deadlocks on its lock)
//! and none of the outer build's flags (they are for the host target).

use std::path::{Path, PathBuf};
use std::process::Command;

pub const TARGET: &str = "wasm32-wasip2";

/// The cargo profile of the components (see the workspace `Cargo.toml`).
const PROFILE: &str = "wasm-guest";

/// The workspace root, from a member's `CARGO_MANIFEST_DIR`.
pub fn workspace_root() -> PathBuf {
    let manifest_dir =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run from a build script"));
    manifest_dir
        .ancestors()
        .find(|dir| dir.join("Cargo.lock").exists() || dir.join("wit").is_dir())
        .expect("inside the workspace")
        .to_path_buf()
}

/// Where nested wasm builds go: beside the outer target dir, never inside its lock.
fn wasm_target_dir(root: &Path) -> PathBuf {
    let outer = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    outer.join("wasm-components")
}

/// Builds `packages` (profile `wasm-guest`, wasm32-wasip2) in one nested cargo run and returns each
/// package's component path, in order. Panics with cargo's output on failure: a build script
/// has no better way to fail.
pub fn build_components(packages: &[&str]) -> Vec<PathBuf> {
    let root = workspace_root();
    let target_dir = wasm_target_dir(&root);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(&root)
        .args([
            "build",
            "--profile",
            PROFILE,
            "--target",
            TARGET,
            "--target-dir",
        ])
        .arg(&target_dir);
    for package in packages {
        command.args(["-p", package]);
    }
    // Outer-build settings that would break or pollute the nested build.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_FEATURE_")
            || key.starts_with("CARGO_CFG_")
            || matches!(
                &*key,
                "RUSTFLAGS"
                    | "CARGO_ENCODED_RUSTFLAGS"
                    | "CARGO_TARGET_DIR"
                    | "CARGO_BUILD_TARGET"
                    | "CARGO_BUILD_RUSTFLAGS"
                    | "RUSTC_WORKSPACE_WRAPPER"
                    | "TARGET"
                    | "OUT_DIR"
            )
        {
            command.env_remove(&*key);
        }
    }
    let output = command.output().expect("cannot run the nested cargo");
    if !output.status.success() {
        panic!(
            "building wasm components {packages:?} failed (is the {TARGET} target installed? `rustup target add {TARGET}`):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let out = target_dir.join(TARGET).join(PROFILE);
    packages
        .iter()
        .map(|package| {
            let path = out.join(format!("{}.wasm", package.replace('-', "_")));
            assert!(
                path.exists(),
                "the nested build did not produce {}",
                path.display()
            );
            path
        })
        .collect()
}

/// Tells cargo to rerun the build script when anything under these workspace paths changes.
pub fn rerun_if_changed(paths: &[&str]) {
    let root = workspace_root();
    for path in paths {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
}
