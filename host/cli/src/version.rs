//! `tether --version` and `tether version [--json]`: what was built, from which commit, for
//! which target, on which wasmtime, and which policy contract lines it loads.

use serde::Serialize;

/// What this build is.
#[derive(Debug, Serialize)]
pub struct Build {
    pub version: &'static str,
    pub commit: &'static str,
    pub target: &'static str,
    pub wasmtime: &'static str,
    /// Per contract line loaded, newest first: the oldest version loaded and the newest whose
    /// additions this host knows.
    pub contracts: Vec<ContractLine>,
}

#[derive(Debug, Serialize)]
pub struct ContractLine {
    pub package: &'static str,
    pub oldest: &'static str,
    pub newest: &'static str,
}

pub fn build() -> Build {
    Build {
        version: env!("CARGO_PKG_VERSION"),
        commit: env!("TETHER_COMMIT"),
        target: env!("TETHER_TARGET"),
        wasmtime: env!("TETHER_WASMTIME"),
        contracts: tether::policy::contract_support()
            .into_iter()
            .map(|(oldest, newest)| ContractLine {
                package: "tether:policy",
                oldest,
                newest,
            })
            .collect(),
    }
}

/// The lines after `tether VERSION` in `--version`.
pub fn long() -> String {
    let build = build();
    let contracts = build
        .contracts
        .iter()
        .map(|line| format!("{} {} to {}", line.package, line.oldest, line.newest))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{}\ncommit:    {}\ntarget:    {}\nwasmtime:  {}\ncontracts: {contracts}",
        build.version, build.commit, build.target, build.wasmtime
    )
}

/// `tether version [--json]`.
pub fn print(json: bool) -> std::process::ExitCode {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&build()).expect("the build serializes")
        );
    } else {
        println!("tether {}", long());
    }
    std::process::ExitCode::SUCCESS
}
