//! `${...}` variable expansion in config string values.
//!
//! Grammar (a `$` not followed by `{` is literal; there is no escape for a literal `${`):
//!
//! ```text
//! reference := "${" NAME "}"               the variable NAME; unset → error
//!            | "${" NAME ":-" DEFAULT "}"  NAME if set and non-empty, else DEFAULT (literal
//!                                          text without `}` or `${`)
//!            | "${env:" NAME "}"           (VS Code style) the variable NAME; unset → error
//! NAME      := [A-Za-z_][A-Za-z0-9_]*
//! ```
//!
//! `${input:ID}` (a VS Code prompt) is always an error: Tether never prompts. In VS Code files
//! the predefined `${workspaceFolder}` and `${userHome}` are also known (they take precedence
//! over environment variables of the same name there).
//!
//! Errors name the variable, never its value, and point into the config text by character
//! position rather than quoting it.

/// Why a string could not be expanded.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ExpandError {
    /// A required variable is not set.
    Unset { var: String },
    /// A malformed or unsupported reference.
    Invalid(String),
}

/// Where variable values come from.
pub(crate) struct Vars<'a> {
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// Predefined variables (VS Code's `workspaceFolder`, `userHome`), looked up first by
    /// the plain `${NAME}` form.
    pub predefined: &'a [(&'static str, String)],
}

const FORMS: &str = "use `${NAME}`, `${NAME:-default}` or `${env:NAME}`";

/// Expands every reference in `text`.
pub(crate) fn expand(text: &str, vars: &Vars) -> Result<String, ExpandError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        // 1-based character position of the `$` in the whole string, for messages.
        let consumed = text.len() - rest.len() + start;
        let at = text[..consumed].chars().count() + 1;
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(ExpandError::Invalid(format!(
                "the `${{` at character {at} is not closed by `}}`"
            )));
        };
        out.push_str(&resolve(&after[..end], at, vars)?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn resolve(body: &str, at: usize, vars: &Vars) -> Result<String, ExpandError> {
    let required = |name: &str| (vars.env)(name).ok_or_else(|| unset(name));
    if let Some(name) = body.strip_prefix("env:") {
        check_name(name, at)?;
        return required(name);
    }
    if let Some(id) = body.strip_prefix("input:") {
        let id = if is_name_like(id) { id } else { "ID" };
        return Err(ExpandError::Invalid(format!(
            "`${{input:{id}}}` (character {at}) asks VS Code to prompt for a value, which \
             Tether cannot do; set an environment variable and reference it with `${{env:NAME}}`"
        )));
    }
    if let Some((name, default)) = body.split_once(":-") {
        check_name(name, at)?;
        if default.contains("${") {
            return Err(ExpandError::Invalid(format!(
                "the default of the reference at character {at} contains `${{`: nested \
                 references are not supported"
            )));
        }
        return Ok(match (vars.env)(name) {
            Some(v) if !v.is_empty() => v,
            _ => default.to_string(),
        });
    }
    check_name(body, at)?;
    if let Some((_, v)) = vars.predefined.iter().find(|(k, _)| *k == body) {
        return Ok(v.clone());
    }
    required(body)
}

fn unset(name: &str) -> ExpandError {
    ExpandError::Unset {
        var: name.to_string(),
    }
}

fn check_name(name: &str, at: usize) -> Result<(), ExpandError> {
    if is_var_name(name) {
        return Ok(());
    }
    let message = match name.split_once(':') {
        Some((kind, _)) if is_name_like(kind) => format!(
            "unsupported variable kind `{kind}:` in the reference at character {at}; {FORMS}"
        ),
        _ => format!(
            "invalid variable reference at character {at}; {FORMS}, where NAME is made of \
             letters, digits and `_` and does not start with a digit"
        ),
    };
    Err(ExpandError::Invalid(message))
}

/// `[A-Za-z_][A-Za-z0-9_]*`
pub(crate) fn is_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Safe to quote in a message: a short identifier.
fn is_name_like(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOME" => Some("/home/u".into()),
            "TOKEN" => Some("s3cr3t".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    fn run(text: &str) -> Result<String, ExpandError> {
        expand(
            text,
            &Vars {
                env: &env,
                predefined: &[],
            },
        )
    }

    #[test]
    fn expand_plain_variable() {
        assert_eq!(run("${HOME}/x").unwrap(), "/home/u/x");
        assert_eq!(run("a${TOKEN}b${TOKEN}").unwrap(), "as3cr3tbs3cr3t");
        assert_eq!(run("${EMPTY}").unwrap(), "");
        assert_eq!(run("no refs $HOME $ {x}").unwrap(), "no refs $HOME $ {x}");
        assert_eq!(run("cost: 5$").unwrap(), "cost: 5$");
    }

    #[test]
    fn expand_default_form() {
        assert_eq!(run("${NOPE:-fallback}").unwrap(), "fallback");
        assert_eq!(run("${EMPTY:-fallback}").unwrap(), "fallback");
        assert_eq!(run("${HOME:-fallback}").unwrap(), "/home/u");
        assert_eq!(run("${NOPE:-}").unwrap(), "");
        assert_eq!(
            run("http://${NOPE:-127.0.0.1:8080}/mcp").unwrap(),
            "http://127.0.0.1:8080/mcp"
        );
    }

    #[test]
    fn expand_env_prefix_form() {
        assert_eq!(run("Bearer ${env:TOKEN}").unwrap(), "Bearer s3cr3t");
        assert_eq!(
            run("${env:NOPE}"),
            Err(ExpandError::Unset { var: "NOPE".into() })
        );
    }

    #[test]
    fn expand_unset_names_the_variable() {
        assert_eq!(
            run("x${NOPE}"),
            Err(ExpandError::Unset { var: "NOPE".into() })
        );
    }

    #[test]
    fn expand_malformed_references_never_quote_the_text() {
        for (text, needle) in [
            ("abc ${TOKEN", "not closed"),
            ("${}", "invalid variable reference at character 1"),
            ("x${1A}", "invalid variable reference at character 2"),
            ("${sk-secret-value}", "invalid variable reference"),
            ("${command:foo}", "unsupported variable kind `command:`"),
            ("${A:-${B}}", "nested"),
            ("${input:api-key}", "`${input:api-key}`"),
        ] {
            let Err(ExpandError::Invalid(msg)) = run(text) else {
                panic!("{text}: expected an error")
            };
            assert!(msg.contains(needle), "{text}: {msg}");
            assert!(!msg.contains("secret"), "{msg}");
        }
    }

    #[test]
    fn predefined_variables_take_precedence() {
        let predefined = [("workspaceFolder", "/ws".to_string())];
        let vars = Vars {
            env: &env,
            predefined: &predefined,
        };
        assert_eq!(
            expand("${workspaceFolder}/a", &vars).unwrap(),
            "/ws/a".to_string()
        );
        assert_eq!(
            expand("${env:workspaceFolder}", &vars),
            Err(ExpandError::Unset {
                var: "workspaceFolder".into()
            })
        );
    }
}
