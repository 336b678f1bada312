//! Log levels in RFC 5424 order, for the fixture servers (a `#[path]` module of each).

#![allow(deprecated)] // logging: the fixtures play servers of the older generation

use rmcp::model::LoggingLevel;

/// Least severe first.
pub fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}
