//! `tether policy new`: writes a policy project to start from, in Rust, Python or JavaScript.
//! Each builds with `./build.sh OUT.wasm` (installing its pinned toolchain locally) and passes
//! the contract level of `tether policy check`. The templates live in `host/cli/templates/`
//! and are compiled into the binary, with the contract's WIT.

use std::path::Path;
use std::process::ExitCode;

use crate::args::Lang;

/// One file of a template: its path in the project and its contents (a `.sh` is executable).
type File = (&'static str, &'static str);

const WIT: &str = include_str!("../../../wit/0.2/policy.wit");

macro_rules! template {
    ($lang:literal: $($path:literal),* $(,)?) => {
        &[$(($path, include_str!(concat!("../templates/", $lang, "/", $path)))),*]
    };
}

const RUST: &[File] =
    template!("rust": "Cargo.toml", "Cargo.lock", "src/lib.rs", ".gitignore", "build.sh");
const PYTHON: &[File] = template!("python": "app.py", ".gitignore", "build.sh");
const JS: &[File] = template!("js":
    "policy.js", "package.json", "package-lock.json", ".gitignore", "build.sh");

fn files(lang: Lang) -> &'static [File] {
    match lang {
        Lang::Rust => RUST,
        Lang::Python => PYTHON,
        Lang::Js => JS,
    }
}

pub fn new(lang: Lang, dir: &Path) -> ExitCode {
    match write(lang, dir) {
        Ok(()) => {
            println!(
                "wrote a {lang} policy into {dir}; build and check it with:\n  \
                 {dir}/build.sh policy.wasm && tether policy check policy.wasm",
                dir = dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(2)
        }
    }
}

fn write(lang: Lang, dir: &Path) -> Result<(), String> {
    let occupied = match std::fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_some(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => false,
        Err(error) => return Err(format!("cannot use {}: {error}", dir.display())),
    };
    if occupied {
        return Err(format!(
            "{} is not empty: a new policy goes into a new or empty directory",
            dir.display()
        ));
    }
    let wit = ("wit/policy.wit", WIT);
    for (path, contents) in files(lang).iter().chain([&wit]) {
        let target = dir.join(path);
        let written = target
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&target, contents))
            .and_then(|()| make_executable(&target, path.ends_with(".sh")));
        written.map_err(|e| format!("cannot write {}: {e}", target.display()))?;
    }
    Ok(())
}

#[cfg(unix)]
fn make_executable(path: &Path, executable: bool) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if executable {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

#[cfg(not(unix))]
fn make_executable(_: &Path, _: bool) -> std::io::Result<()> {
    Ok(())
}
