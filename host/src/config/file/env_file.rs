//! A VS Code `envFile` (dotenv), read as VS Code reads it, so a server gets the same
//! environment through Tether as without it: `export ` prefixes, `KEY=value` or `KEY: value`,
//! `#` comments on their own line or after a value (outside quotes), values in double, single or
//! back quotes (double quotes turn `\n` and `\r` into line breaks), later keys over earlier ones.
//! No `$VAR` is expanded: VS Code expands none.

/// What an env file defines (each key once, its last value), and the lines it skipped.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct EnvFile {
    pub vars: Vec<(String, String)>,
    /// 1-based numbers of lines that are neither blank, a comment, nor a definition.
    pub skipped: Vec<usize>,
    /// 1-based numbers of lines whose name or value no process environment can hold (a `=`
    /// in the name, a NUL anywhere).
    pub unusable: Vec<usize>,
}

pub(super) fn parse(text: &str) -> EnvFile {
    let mut file = EnvFile::default();
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    for (index, line) in text.split('\n').enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").map_or(line, str::trim);
        let Some(separator) = outside_quotes(line, |c| c == '=' || c == ':') else {
            file.skipped.push(index + 1);
            continue;
        };
        let key = line[..separator].trim();
        if key.is_empty() {
            file.skipped.push(index + 1);
            continue;
        }
        let mut value = line[separator + 1..].trim();
        if let Some(comment) = outside_quotes(value, |c| c == '#') {
            value = value[..comment].trim();
        }
        let value = unquote(value);
        if key.contains(['=', '\0']) || value.contains('\0') {
            file.unusable.push(index + 1);
            continue;
        }
        match file.vars.iter_mut().find(|(known, _)| known == key) {
            Some((_, earlier)) => *earlier = value,
            None => file.vars.push((key.to_string(), value)),
        }
    }
    file
}

/// The byte index of the first character matching `wanted` outside quotes. A quote closes at
/// the next same quote not preceded by a backslash.
fn outside_quotes(text: &str, wanted: impl Fn(char) -> bool) -> Option<usize> {
    let mut open: Option<char> = None;
    let mut previous = '\0';
    for (index, c) in text.char_indices() {
        match open {
            Some(quote) if c == quote && previous != '\\' => open = None,
            Some(_) => {}
            None if matches!(c, '"' | '\'' | '`') => open = Some(c),
            None if wanted(c) => return Some(index),
            None => {}
        }
        previous = c;
    }
    None
}

/// A value wrapped in one kind of quote, without them.
fn unquote(value: &str) -> String {
    for quote in ['"', '\'', '`'] {
        if value.len() >= 2
            && let Some(inner) = value
                .strip_prefix(quote)
                .and_then(|rest| rest.strip_suffix(quote))
        {
            return match quote {
                '"' => inner.replace("\\n", "\n").replace("\\r", "\r"),
                _ => inner.to_string(),
            };
        }
    }
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(text: &str) -> Vec<(&'static str, String)> {
        let file = parse(text);
        file.vars
            .into_iter()
            .map(|(k, v)| (&*Box::leak(k.into_boxed_str()), v))
            .collect()
    }

    #[test]
    fn values_as_vs_code_reads_them() {
        let text = "# a comment\r\n\
                    \n\
                    export A=plain value # a note\n\
                    B=\"quoted # not a comment\" # a note\n\
                    C='single \\n kept'\n\
                    D=\"two\\nlines\"\n\
                    E=`back`\n\
                    F: colon\n\
                    G=\n\
                    H=a=b\n\
                    I=\"\n\
                    URL=https://host/path#fragment\n\
                    export   J = spaced  \n";
        assert_eq!(
            vars(text),
            [
                ("A", "plain value".to_string()),
                ("B", "quoted # not a comment".to_string()),
                ("C", "single \\n kept".to_string()),
                ("D", "two\nlines".to_string()),
                ("E", "back".to_string()),
                ("F", "colon".to_string()),
                ("G", String::new()),
                ("H", "a=b".to_string()),
                ("I", "\"".to_string()),
                // As in VS Code: a `#` outside quotes starts a comment, even in a URL.
                ("URL", "https://host/path".to_string()),
                ("J", "spaced".to_string()),
            ]
        );
    }

    #[test]
    fn lines_that_define_nothing_are_skipped_and_named() {
        let file = parse("\u{feff}A=1\njust words\n=no key\n\"K=v\"\nB=2\n\"C=D\"=x\nA=3\n");
        assert_eq!(
            file.vars,
            [("A".into(), "3".into()), ("B".into(), "2".into())],
            "a byte-order mark is no part of the first name; the last value of a name wins"
        );
        assert_eq!(file.skipped, [2, 3, 4]);
        assert_eq!(file.unusable, [6]);
    }
}
