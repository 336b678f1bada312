//! Tether's benchmarks. Each subcommand measures Tether and, in the same run, a baseline, and
//! prints a small table with the ratio. See docs/BENCHMARKS.md for the results and how to run.

mod chaos;
mod cold_start;
mod cost;
mod forwarding;
mod gateway;
mod policy;
mod recovery;
mod scale;
mod stats;
mod swap;
mod util;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "tether-bench", about = "Tether's benchmarks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Policy decision cost: wasm (direct and through the policy runtime) vs native.
    Policy(policy::Args),
    /// Echo-tool latency and throughput through `tether serve` vs direct.
    Gateway(gateway::Args),
    /// The benchmark of record for forwarding: direct, a byte relay and Tether, over stdio and
    /// HTTP, results of 100 B to 2 MB, 1 to 64 clients.
    Forwarding(forwarding::Args),
    /// The gateway's instructions per forwarded call (callgrind), for both client generations.
    GatewayCost(cost::Args),
    /// SIGKILL an upstream and time each recovery step.
    Recovery(recovery::Args),
    /// Host memory, idle CPU and readiness for many supervised servers.
    Scale(scale::Args),
    /// Policy hot swaps under call load.
    Swap(swap::Args),
    /// Process start to first `tools/list` answer.
    ColdStart(cold_start::Args),
    /// Chaos soak: servers killed, hung, flapping, restarted and garbling while clients call;
    /// checks invariants (exits 1 when one broke). Not part of `all`.
    Chaos(chaos::Args),
    /// Everything with default settings.
    All,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    util::print_machine_info();
    let result = run(cli.command);
    util::remove_scratch();
    result
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Policy(args) => policy::run(&args),
        Command::Gateway(args) => gateway::run(&args),
        Command::Forwarding(args) => forwarding::run(&args),
        Command::GatewayCost(args) => cost::run(&args),
        Command::Recovery(args) => recovery::run(&args),
        Command::Scale(args) => scale::run(&args),
        Command::Swap(args) => swap::run(&args),
        Command::ColdStart(args) => cold_start::run(&args),
        Command::Chaos(args) => chaos::run(&args),
        Command::All => {
            policy::run(&policy::Args::parse_from(["policy"]))?;
            gateway::run(&gateway::Args::parse_from(["gateway"]))?;
            recovery::run(&recovery::Args::parse_from(["recovery"]))?;
            swap::run(&swap::Args::parse_from(["swap"]))?;
            cold_start::run(&cold_start::Args::parse_from(["cold-start"]))?;
            scale::run(&scale::Args::parse_from(["scale"]))
        }
    }
}
