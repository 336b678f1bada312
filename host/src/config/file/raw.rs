//! A format-neutral, order-preserving view of a parsed JSON or TOML document.
//!
//! Both formats are read into [`Raw`] first, so that one code path checks types, names and
//! unknown keys with Tether's own messages (which never echo a value from the file), and so
//! that servers keep the order in which the file lists them.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A parsed value. Tables keep their keys in file order; duplicate keys are rejected while
/// parsing.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Raw {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    /// A TOML date/time, kept as its TOML text.
    Datetime(String),
    Array(Vec<Raw>),
    Table(Vec<(String, Raw)>),
}

/// A syntax error with its 1-based position.
#[derive(Debug)]
pub(crate) struct SyntaxError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl Raw {
    /// What kind of value this is, for "expected X, found Y" messages.
    pub fn kind(&self, toml: bool) -> &'static str {
        match self {
            Raw::Null => "null",
            Raw::Bool(_) => "a boolean",
            Raw::Int(_) if toml => "an integer",
            Raw::Float(_) if toml => "a float",
            Raw::Int(_) | Raw::Float(_) => "a number",
            Raw::Str(_) => "a string",
            Raw::Datetime(_) => "a date-time",
            Raw::Array(_) => "an array",
            Raw::Table(_) if toml => "a table",
            Raw::Table(_) => "an object",
        }
    }

    /// The value under `key` when `self` is a table; JSON `null` counts as absent.
    pub fn get(&self, key: &str) -> Option<&Raw> {
        match self {
            Raw::Table(entries) => table_get(entries, key),
            _ => None,
        }
    }

    /// This value as JSON. Fails only for non-finite floats (TOML `nan`/`inf`).
    pub fn to_json(&self) -> Result<serde_json::Value, &'static str> {
        use serde_json::Value;
        Ok(match self {
            Raw::Null => Value::Null,
            Raw::Bool(b) => Value::Bool(*b),
            Raw::Int(n) => {
                if let Ok(u) = u64::try_from(*n) {
                    Value::from(u)
                } else if let Ok(i) = i64::try_from(*n) {
                    Value::from(i)
                } else {
                    return Err("an integer too large for JSON");
                }
            }
            Raw::Float(f) => serde_json::Number::from_f64(*f)
                .map(Value::Number)
                .ok_or("a non-finite number (nan or inf), which JSON cannot hold")?,
            Raw::Str(s) | Raw::Datetime(s) => Value::String(s.clone()),
            Raw::Array(items) => Value::Array(
                items
                    .iter()
                    .map(Raw::to_json)
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Raw::Table(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), v.to_json()?)))
                    .collect::<Result<serde_json::Map<_, _>, &'static str>>()?,
            ),
        })
    }
}

/// The value under `key`; JSON `null` counts as absent.
pub(crate) fn table_get<'a>(entries: &'a [(String, Raw)], key: &str) -> Option<&'a Raw> {
    entries
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
        .filter(|v| !matches!(v, Raw::Null))
}

/// Parses JSON, tolerating the `//` and `/* */` comments and trailing commas that VS Code
/// allows in its JSONC files (stripped first, keeping every line and column in place).
pub(crate) fn parse_json(text: &str) -> Result<Raw, SyntaxError> {
    let cleaned = strip_jsonc(text);
    serde_json::from_str::<Raw>(&cleaned).map_err(|e| {
        let (line, column) = (e.line(), e.column());
        let full = e.to_string();
        let suffix = format!(" at line {line} column {column}");
        let message = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
        SyntaxError {
            line,
            column,
            message,
        }
    })
}

/// Parses TOML into a table (in document order).
pub(crate) fn parse_toml(text: &str) -> Result<Raw, SyntaxError> {
    match toml::from_str::<toml::Table>(text) {
        Ok(table) => Ok(from_toml_table(table)),
        Err(e) => {
            let offset = e.span().map(|s| s.start).unwrap_or(0).min(text.len());
            let (line, column) = line_column(text, offset);
            Err(SyntaxError {
                line,
                column,
                message: e.message().trim_end().to_string(),
            })
        }
    }
}

fn from_toml_table(table: toml::Table) -> Raw {
    Raw::Table(table.into_iter().map(|(k, v)| (k, from_toml(v))).collect())
}

fn from_toml(value: toml::Value) -> Raw {
    match value {
        toml::Value::String(s) => Raw::Str(s),
        toml::Value::Integer(n) => Raw::Int(n.into()),
        toml::Value::Float(f) => Raw::Float(f),
        toml::Value::Boolean(b) => Raw::Bool(b),
        toml::Value::Datetime(d) => Raw::Datetime(d.to_string()),
        toml::Value::Array(items) => Raw::Array(items.into_iter().map(from_toml).collect()),
        toml::Value::Table(t) => from_toml_table(t),
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset;
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    (line, before[line_start..].chars().count() + 1)
}

/// Blanks out JSONC comments and trailing commas with spaces (newlines are kept, so the
/// parser's line and column still point into the original text).
fn strip_jsonc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    // Byte index in `out` of the last significant character outside comments, and whether
    // it was a comma.
    let mut last_comma: Option<usize> = None;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                last_comma = None;
                out.push(c);
                let mut escaped = false;
                for c in chars.by_ref() {
                    out.push(c);
                    if escaped {
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == '"' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'/') => {
                out.push(' ');
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                    blank(&mut out, c);
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                out.push(' ');
                blank(&mut out, chars.next().unwrap_or(' '));
                let mut prev = ' ';
                for c in chars.by_ref() {
                    blank(&mut out, c);
                    if prev == '*' && c == '/' {
                        break;
                    }
                    prev = c;
                }
            }
            '}' | ']' => {
                if let Some(i) = last_comma.take() {
                    out.replace_range(i..i + 1, " ");
                }
                out.push(c);
            }
            ',' => {
                last_comma = Some(out.len());
                out.push(c);
            }
            c if c.is_whitespace() => out.push(c),
            c => {
                last_comma = None;
                out.push(c);
            }
        }
    }
    out
}

/// Replaces a commented-out character with spaces of the same byte length (newlines stay).
fn blank(out: &mut String, c: char) {
    if c == '\n' || c == '\r' {
        out.push(c);
    } else {
        out.extend(std::iter::repeat_n(' ', c.len_utf8()));
    }
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(RawVisitor)
    }
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = Raw;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Raw, E> {
        Ok(Raw::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Raw, E> {
        Ok(Raw::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Raw, E> {
        Ok(Raw::Int(v.into()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Raw, E> {
        Ok(Raw::Int(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Raw, E> {
        Ok(Raw::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Raw, E> {
        Ok(Raw::Str(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Raw, E> {
        Ok(Raw::Str(v))
    }
    fn visit_unit<E>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }
    fn visit_none<E>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Raw, D::Error> {
        Raw::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Raw::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
        let mut entries: Vec<(String, Raw)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if entries.iter().any(|(k, _)| *k == key) {
                return Err(de::Error::custom(format_args!("duplicate key `{key}`")));
            }
            let value = map.next_value()?;
            entries.push((key, value));
        }
        Ok(Raw::Table(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonc_comments_and_trailing_commas_are_blanked_in_place() {
        let text =
            "{\n  // a comment\n  \"a\": \"x // not a comment\", /* b */\n  \"b\": [1, 2,],\n}";
        let stripped = strip_jsonc(text);
        assert_eq!(stripped.len(), text.len());
        assert_eq!(stripped.lines().count(), text.lines().count());
        let raw = parse_json(text).unwrap();
        assert_eq!(raw.get("a"), Some(&Raw::Str("x // not a comment".into())));
        assert_eq!(
            raw.get("b"),
            Some(&Raw::Array(vec![Raw::Int(1), Raw::Int(2)]))
        );
    }

    #[test]
    fn json_keeps_order_and_rejects_duplicate_keys() {
        let raw = parse_json(r#"{"z": 1, "a": 2, "m": 3}"#).unwrap();
        let Raw::Table(entries) = raw else { panic!() };
        let keys: Vec<_> = entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["z", "a", "m"]);
        let err = parse_json("{\"a\": 1,\n \"a\": 2}").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.message.contains("duplicate key `a`"), "{}", err.message);
    }

    #[test]
    fn toml_keeps_order_and_reports_position() {
        let raw = parse_toml("[servers.z]\n[servers.a]\n").unwrap();
        let Some(Raw::Table(entries)) = raw.get("servers") else {
            panic!()
        };
        let keys: Vec<_> = entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["z", "a"]);
        let err = parse_toml("a = 1\nb = \n").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.column >= 4, "{err:?}");
    }
}
