//! What `tether version` says about the build: the commit, the target and the wasmtime
//! version, as environment variables for the compiler.

use std::process::Command;

fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // A new commit (HEAD moves, or the branch it names does) rebuilds the line.
    for watched in [".git/HEAD", ".git/refs/heads", ".git/packed-refs"] {
        let path = root.join(watched);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    println!(
        "cargo:rerun-if-changed={}",
        root.join("Cargo.lock").display()
    );
    let commit =
        git(&root, &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&root, &["status", "--porcelain", "--untracked-files=no"])
        .is_some_and(|changes| !changes.is_empty());
    let commit = if dirty {
        format!("{commit}-modified")
    } else {
        commit
    };
    println!("cargo:rustc-env=TETHER_COMMIT={commit}");
    println!(
        "cargo:rustc-env=TETHER_TARGET={}",
        std::env::var("TARGET").unwrap_or_else(|_| "unknown".into())
    );
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap_or_default();
    println!(
        "cargo:rustc-env=TETHER_WASMTIME={}",
        locked_version(&lock, "wasmtime")
    );
}

fn git(root: &std::path::Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// The version of package `name` in a Cargo.lock, or "unknown".
fn locked_version(lock: &str, name: &str) -> String {
    let wanted = format!("name = \"{name}\"");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == wanted
            && let Some(version) = lines
                .next()
                .and_then(|l| l.trim().strip_prefix("version = "))
        {
            return version.trim_matches('"').to_string();
        }
    }
    "unknown".into()
}
