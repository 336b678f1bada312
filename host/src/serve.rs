//! `tether serve`: config → policy → supervisor → gateway (+ admin API), until a signal.

use std::process::ExitCode;

use crate::cli::ServeArgs;

pub fn main(_args: ServeArgs) -> ExitCode {
    eprintln!("error: serve is being written");
    ExitCode::FAILURE
}
