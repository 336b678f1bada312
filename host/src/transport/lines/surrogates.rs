//! Lone UTF-16 surrogate escapes, which JavaScript writes and serde refuses.
//!
//! `JSON.stringify` escapes a string's unpaired surrogate as `\ud83d` (a JavaScript server that
//! cuts text with `slice` can split an emoji), and JavaScript and Python read it back. serde
//! refuses such a line as not JSON, so a server's answer carrying one would never reach its
//! caller. Such a line is read with U+FFFD in place of each unpaired escape, as a UTF-8 encoder
//! writes one.

/// `line` with every unpaired surrogate escape replaced by `\ufffd`, or `None` when it has none.
pub(crate) fn replace_lone(line: &[u8]) -> Option<Vec<u8>> {
    let mut repaired: Option<Vec<u8>> = None;
    let mut at = 0;
    while let Some(offset) = memchr::memchr(b'\\', line.get(at..).unwrap_or_default()) {
        let escape = at + offset;
        let Some(unit) = unit_at(line, escape) else {
            // Any other escape: its character is skipped with it (`\\u…` is no escape).
            at = escape + 2;
            continue;
        };
        let paired = match unit {
            0xD800..=0xDBFF => unit_at(line, escape + 6).is_some_and(is_low),
            _ => false,
        };
        if paired {
            at = escape + 12;
        } else {
            if is_high(unit) || is_low(unit) {
                let copy = repaired.get_or_insert_with(|| line.to_vec());
                copy[escape..escape + 6].copy_from_slice(br"\ufffd");
            }
            at = escape + 6;
        }
    }
    repaired
}

/// The code unit of the `\uXXXX` escape at `at`, if there is one.
fn unit_at(line: &[u8], at: usize) -> Option<u16> {
    let escape = line.get(at..at + 6)?;
    if escape[0] != b'\\' || escape[1] != b'u' {
        return None;
    }
    let hex = std::str::from_utf8(&escape[2..]).ok()?;
    u16::from_str_radix(hex, 16).ok()
}

fn is_high(unit: u16) -> bool {
    (0xD800..=0xDBFF).contains(&unit)
}

fn is_low(unit: u16) -> bool {
    (0xDC00..=0xDFFF).contains(&unit)
}

#[cfg(test)]
mod tests {
    use super::replace_lone;

    fn repaired(line: &str) -> Option<String> {
        replace_lone(line.as_bytes()).map(|bytes| String::from_utf8(bytes).unwrap())
    }

    #[test]
    fn unpaired_surrogate_escapes_become_replacement_characters_and_nothing_else_changes() {
        // A high one cut off from its pair, as `"Hi 😀".slice(0, 4)` writes it; a lone low one;
        // upper-case hex.
        assert_eq!(
            repaired(r#"{"text":"Hi \ud83d"}"#).as_deref(),
            Some(r#"{"text":"Hi \ufffd"}"#)
        );
        assert_eq!(
            repaired(r#"["\ude00x","\uD83D\u0041"]"#).as_deref(),
            Some(r#"["\ufffdx","\ufffd\u0041"]"#)
        );
        // Pairs, other escapes, an escaped backslash before `u`, and a line ending in a
        // backslash are left alone.
        for untouched in [
            r#"{"text":"\ud83d\ude00 \u00e9 \n \" \\ud83d"}"#,
            r#"{"text":"plain"}"#,
            r#"{"text":"\u12"#,
            "\\",
        ] {
            assert_eq!(repaired(untouched), None, "{untouched}");
        }
        // A line cut off after one.
        assert_eq!(
            repaired(r#"["\ud83d\"#).as_deref(),
            Some(r#"["\ufffd\"#)
        );
        // What serde refuses, it reads once repaired.
        let line = replace_lone(br#"{"text":"Hi \ud83d"}"#).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(value["text"], "Hi \u{fffd}");
        assert!(serde_json::from_slice::<serde_json::Value>(br#"{"text":"Hi \ud83d"}"#).is_err());
    }
}
