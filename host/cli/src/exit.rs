//! The exit codes of `tether`, one meaning each (the README lists them).

/// The request was refused or failed, or a check found a problem (`policy check`: a scenario
/// failed).
pub const REFUSED: u8 = 1;
/// The command line is wrong or does not say enough (which gateway, which token, a file to
/// write into). clap's own usage errors exit 2 too.
pub const USAGE: u8 = 2;
/// No running gateway could be found or reached.
pub const UNREACHABLE: u8 = 3;
/// The configuration, a server's settings or the policy component (or its settings) cannot be
/// used: `serve` refuses to start, `config check` and `policy check` say why.
pub const CONFIG: u8 = 4;
