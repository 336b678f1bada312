#[global_allocator]
static ALLOCATOR: tether_cli::Allocator = tether_cli::Allocator {};

fn main() -> std::process::ExitCode {
    tether_cli::main()
}
