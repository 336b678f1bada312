//! Whether a tool call goes out again, sans IO: the rule that keeps a call from running twice
//! ("never replay an uncertain call"). The call path (`mod.rs`) asks it after every try.

use crate::upstream::CallFailure;

/// How many times a call may be sent at most: the first try and one more.
const MAX_TRIES: u32 = 2;

/// What to do after a try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Answer the caller with this try's result.
    Answer,
    /// Send the call again. `report_loss`: this try reached the server and was lost, so the
    /// policy hears of it first (it counts as a failure) and the new try is a new call.
    /// `same_session`: the server failed only this request and the session lives on, so the
    /// new try goes to it; otherwise to a session opened after this try's.
    Again {
        report_loss: bool,
        same_session: bool,
    },
}

/// Whether another try may follow the `tries`-th (1-based).
fn may_follow(tries: u32) -> bool {
    tries < MAX_TRIES
}

/// What to do after the `tries`-th try (1-based) of a call to a tool that is `read_only` or
/// not, whose outcome was `result`; `arguments_here`: whether the arguments are there to send
/// again (a try takes them; its transport hands them back, copied by no one).
pub(crate) fn after<T>(
    result: &Result<T, CallFailure>,
    read_only: bool,
    tries: u32,
    arguments_here: bool,
) -> Next {
    if !may_follow(tries) || !arguments_here {
        return Next::Answer;
    }
    match result {
        // It never left: it certainly did not run, whatever the tool does.
        Err(CallFailure::NotSent(_)) => Next::Again {
            report_loss: false,
            same_session: false,
        },
        // It may have run: only a tool without side effects may run twice.
        Err(CallFailure::Lost(_)) if read_only => Next::Again {
            report_loss: true,
            same_session: false,
        },
        // The server failed this request and the session lives on: the session is kept (other
        // calls run on it), unless the server asked for time (429, 503), which an immediate
        // second try would not give it.
        Err(CallFailure::HttpStatus(status)) if read_only && !asks_for_time(*status) => {
            Next::Again {
                report_loss: true,
                same_session: true,
            }
        }
        // Answered, timed out (it may still be running), refused, too large, cancelled, or
        // lost with side effects possible: the caller decides.
        _ => Next::Answer,
    }
}

/// Whether a try counts toward [`MAX_TRIES`]. Every try does but one: a try sent again on its
/// own session after an HTTP error that never left (the session ended meanwhile). The call
/// then still gets the try on a fresh session a lost call gets; at most two tries ever leave.
pub(crate) fn counts<T>(result: &Result<T, CallFailure>, on_same_session: bool) -> bool {
    !(on_same_session && matches!(result, Err(CallFailure::NotSent(_))))
}

/// Whether an HTTP error status asks the client to come back later rather than at once.
pub(crate) fn asks_for_time(status: u16) -> bool {
    matches!(status, 429 | 503)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Fault;
    use std::time::Duration;

    fn lost() -> Result<(), CallFailure> {
        Err(CallFailure::Lost(Fault::ProcessExited(Some(1))))
    }

    fn not_sent() -> Result<(), CallFailure> {
        Err(CallFailure::NotSent(Fault::TransportClosed("gone".into())))
    }

    fn failed(status: u16) -> Result<(), CallFailure> {
        Err(CallFailure::HttpStatus(status))
    }

    #[test]
    fn a_call_that_never_left_goes_out_once_more_for_any_tool() {
        for read_only in [false, true] {
            assert_eq!(
                after(&not_sent(), read_only, 1, true),
                Next::Again {
                    report_loss: false,
                    same_session: false
                }
            );
        }
    }

    #[test]
    fn a_lost_call_is_repeated_only_for_a_read_only_tool_and_counted_first() {
        assert_eq!(
            after(&lost(), true, 1, true),
            Next::Again {
                report_loss: true,
                same_session: false
            }
        );
        assert_eq!(
            after(&lost(), false, 1, true),
            Next::Answer,
            "never replay an uncertain call"
        );
    }

    #[test]
    fn a_call_that_timed_out_or_was_answered_is_never_repeated() {
        let timed_out: Result<(), _> = Err(CallFailure::TimedOut(Duration::from_secs(30)));
        let too_large: Result<(), _> = Err(CallFailure::TooLarge { size: 9, limit: 1 });
        let cancelled: Result<(), _> = Err(CallFailure::Cancelled);
        for result in [Ok(()), timed_out, too_large, cancelled] {
            for read_only in [false, true] {
                assert_eq!(after(&result, read_only, 1, true), Next::Answer);
            }
        }
    }

    #[test]
    fn a_request_the_server_failed_is_repeated_on_its_session_unless_it_asked_for_time() {
        for status in [500, 502, 504, 408, 425] {
            assert_eq!(
                after(&failed(status), true, 1, true),
                Next::Again {
                    report_loss: true,
                    same_session: true
                },
                "HTTP {status}"
            );
            assert_eq!(
                after(&failed(status), false, 1, true),
                Next::Answer,
                "never replay an uncertain call (HTTP {status})"
            );
            assert_eq!(after(&failed(status), true, 2, true), Next::Answer);
        }
        for status in [429, 503] {
            assert_eq!(after(&failed(status), true, 1, true), Next::Answer);
        }
    }

    #[test]
    fn only_a_second_try_on_the_same_session_that_never_left_goes_uncounted() {
        assert!(!counts(&not_sent(), true));
        assert!(counts(&not_sent(), false));
        assert!(counts(&lost(), true));
        assert!(counts(&failed(500), true));
    }

    #[test]
    fn a_call_whose_arguments_are_gone_is_answered() {
        assert_eq!(after(&not_sent(), false, 1, false), Next::Answer);
        assert_eq!(after(&lost(), true, 1, false), Next::Answer);
    }

    #[test]
    fn there_is_never_a_third_try() {
        assert_eq!(after(&not_sent(), true, 2, true), Next::Answer);
        assert_eq!(after(&lost(), true, 2, true), Next::Answer);
    }
}
