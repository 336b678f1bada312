//! The exit codes of `tether`, one meaning each (the README lists them).

/// The request was refused or failed, or a check found a problem (`policy check`: a scenario
/// failed).
pub const REFUSED: u8 = 1;
/// The command line is wrong or does not say enough (which gateway, which token), or the
/// configuration or component it names cannot be used. clap's own usage errors exit 2 too.
pub const USAGE: u8 = 2;
/// No running gateway could be found or reached.
pub const UNREACHABLE: u8 = 3;
