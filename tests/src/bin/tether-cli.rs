//! The real `tether` command line (the `tether-cli` crate), built in this package so integration
//! tests can run it through `CARGO_BIN_EXE_tether-cli`.

#[global_allocator]
static ALLOCATOR: tether_cli::Allocator = tether_cli::Allocator {};

fn main() -> std::process::ExitCode {
    tether_cli::main()
}
