//! The real `tether` command line (from the library), built in this package so integration
//! tests can run it through `CARGO_BIN_EXE_tether-cli`.

fn main() -> std::process::ExitCode {
    tether::cli::main()
}
