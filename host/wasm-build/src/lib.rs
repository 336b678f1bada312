//! Used by build scripts to build workspace crates as wasm32-wasip2 components with a nested
//! cargo. The nested cargo gets its own target dir (sharing the outer one deadlocks on its lock),
//! none of the outer build's flags (they are for the host target), and the toolchain that
//! `rust-toolchain.toml` pins — installing its wasm32-wasip2 target first when rustup is there, so
//! a fresh machine needs nothing but rustup.

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

/// The `channel` of `rust-toolchain.toml` (a one-line read; the file is ours and simple).
fn pinned_channel(root: &Path) -> Option<String> {
    let text = std::fs::read_to_string(root.join("rust-toolchain.toml")).ok()?;
    text.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "channel").then(|| value.trim().trim_matches('"').to_string())
    })
}

fn rustup_available() -> bool {
    Command::new("rustup")
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success())
}

/// Runs a command the build cannot do without; panics with one line naming it on failure.
fn run_or_panic(command: &mut Command, what: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("cannot run {what}: {error}"));
    if !output.status.success() {
        panic!(
            "{what} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Makes sure `channel` and its wasm32-wasip2 target are installed (the caller holds a lock, so
/// two build scripts never install at once; the second finds the work done).
fn ensure_rustup_target(channel: &str) {
    let toolchains = run_or_panic(
        Command::new("rustup").args(["toolchain", "list"]),
        "`rustup toolchain list`",
    );
    let installed = toolchains.lines().any(|line| {
        line.split_whitespace().next() == Some(channel) || line.starts_with(&format!("{channel}-"))
    });
    if !installed {
        // Said after the fact: cargo repeats a build script's warnings on later builds.
        run_or_panic(
            Command::new("rustup").args([
                "toolchain",
                "install",
                channel,
                "--profile",
                "minimal",
                "--target",
                TARGET,
            ]),
            &format!("`rustup toolchain install {channel} --target {TARGET}`"),
        );
        println!(
            "cargo:warning=installed the Rust {channel} toolchain with the {TARGET} target (rust-toolchain.toml pins them)"
        );
        return;
    }
    let targets = run_or_panic(
        Command::new("rustup").args(["target", "list", "--installed", "--toolchain", channel]),
        "`rustup target list --installed`",
    );
    if !targets.lines().any(|line| line.trim() == TARGET) {
        run_or_panic(
            Command::new("rustup").args(["target", "add", TARGET, "--toolchain", channel]),
            &format!("`rustup target add {TARGET} --toolchain {channel}`"),
        );
        println!(
            "cargo:warning=installed the {TARGET} target for Rust {channel} (the policy component needs it)"
        );
    }
}

/// The rustc of the toolchain whose cargo is `cargo` (beside it), else the outer build's.
fn sibling_rustc(cargo: &str) -> PathBuf {
    let beside = Path::new(cargo).with_file_name("rustc");
    if beside.exists() {
        return beside;
    }
    std::env::var_os("RUSTC").map_or_else(|| PathBuf::from("rustc"), PathBuf::from)
}

/// Without rustup, the toolchain that runs this build must already have the target.
fn check_target_without_rustup(rustc: &Path) {
    let libdir = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", TARGET])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()));
    let has_core = libdir
        .and_then(|dir| std::fs::read_dir(dir).ok())
        .is_some_and(|entries| {
            entries
                .flatten()
                .any(|entry| entry.file_name().to_string_lossy().starts_with("libcore-"))
        });
    if !has_core {
        panic!(
            "the Rust standard library for {TARGET} is not installed and rustup is not on PATH: \
             install rustup (https://rustup.rs) and run `rustup target add {TARGET}`, or add {TARGET} to this toolchain"
        );
    }
}

/// The nested cargo: the pinned toolchain through rustup when it is there, else the cargo
/// that runs this build (with its rustc, which the caller must pass on as `RUSTC`).
fn nested_cargo(root: &Path) -> (Command, Option<PathBuf>) {
    match pinned_channel(root) {
        Some(channel) if rustup_available() => {
            ensure_rustup_target(&channel);
            let mut command = Command::new("rustup");
            command.args(["run", &channel, "cargo"]);
            (command, None)
        }
        _ => {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let rustc = sibling_rustc(&cargo);
            check_target_without_rustup(&rustc);
            (Command::new(cargo), Some(rustc))
        }
    }
}

/// Builds `packages` (profile `wasm-guest`, wasm32-wasip2) in one nested cargo run and returns each
/// package's component path, in order. Panics with cargo's output on failure: a build script
/// has no better way to fail.
pub fn build_components(packages: &[&str]) -> Vec<PathBuf> {
    let root = workspace_root();
    let target_dir = wasm_target_dir(&root);
    std::fs::create_dir_all(&target_dir).expect("create the wasm target dir");
    let lock = std::fs::File::create(target_dir.join(".tether-wasm-build.lock"))
        .expect("create the wasm build lock");
    lock.lock().expect("lock the wasm build");
    let (mut command, rustc) = nested_cargo(&root);
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
    // Outer-build settings that would break or pollute the nested build: flags for the host
    // target, and the outer toolchain's own binaries (RUSTC, RUSTUP_TOOLCHAIN), which would
    // override the pinned one.
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
                    | "RUSTC"
                    | "RUSTDOC"
                    | "RUSTC_LINKER"
                    | "RUSTUP_TOOLCHAIN"
                    | "CARGO"
                    | "TARGET"
                    | "OUT_DIR"
            )
        {
            command.env_remove(&*key);
        }
    }
    if let Some(rustc) = rustc {
        command.env("RUSTC", rustc);
    }
    let output = command.output().expect("cannot run the nested cargo");
    if !output.status.success() {
        panic!(
            "building wasm components {packages:?} failed:\n{}",
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
    println!(
        "cargo:rerun-if-changed={}",
        root.join("rust-toolchain.toml").display()
    );
}
