fn main() -> std::process::ExitCode {
    tether_cli::main()
}
