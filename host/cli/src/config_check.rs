//! `tether config check`: everything `serve` would refuse in a config, found without starting
//! anything (no server spawned or connected, nothing listening).

use std::process::ExitCode;

use tether::Tether;

use crate::args::ConfigCheckArgs;

pub fn check(args: ConfigCheckArgs) -> ExitCode {
    let Some(runtime) = crate::multi_thread_runtime() else {
        return ExitCode::from(crate::exit::REFUSED);
    };
    let builder = crate::with_policy(
        Tether::builder().config_file(&args.file),
        args.policy.as_deref(),
        args.policy_settings.as_deref(),
        args.cache_dir.as_deref(),
    );
    let checked = runtime.block_on(builder.check());
    let file = args.file.display().to_string();
    match checked {
        Ok(report) => {
            if args.json {
                let answer = serde_json::json!({
                    "ok": true,
                    "config": file,
                    "servers": report.servers,
                    "policy": report.policy,
                    "warnings": report.warnings,
                });
                println!("{answer:#}");
            } else {
                let servers: Vec<String> = report
                    .servers
                    .iter()
                    .map(|s| format!("{} ({})", s.name, s.transport))
                    .collect();
                println!(
                    "{file}: usable. {} server{}: {}. Policy {} {} (contract {}, {}).",
                    servers.len(),
                    if servers.len() == 1 { "" } else { "s" },
                    if servers.is_empty() {
                        "none".to_string()
                    } else {
                        servers.join(", ")
                    },
                    report.policy.name,
                    report.policy.version,
                    report.policy.contract,
                    report.policy.label,
                );
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            let (kind, code) = match &error {
                tether::Error::Config(_) => ("config", crate::exit::CONFIG),
                tether::Error::Server { .. } => ("server", crate::exit::CONFIG),
                tether::Error::Policy(_) => ("policy", crate::exit::CONFIG),
                _ => ("other", crate::exit::REFUSED),
            };
            if args.json {
                let answer = serde_json::json!({
                    "ok": false,
                    "config": file,
                    "kind": kind,
                    "error": error.to_string(),
                });
                println!("{answer:#}");
            } else {
                eprintln!("error: {error}");
            }
            ExitCode::from(code)
        }
    }
}
