use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;

use super::*;

const SECRET: &str = "s3cr3t-value";

fn env(name: &str) -> Option<String> {
    match name {
        "TOKEN" => Some(SECRET.to_string()),
        "PORT" => Some("8080".to_string()),
        "EMPTY" => Some(String::new()),
        "BAD_HEADER" => Some(format!("{SECRET}\nX-Injected: 1")),
        _ => None,
    }
}

const JSON_FILE: &str = "/etc/tether/claude.json";
const VSCODE_FILE: &str = "/ws/.vscode/mcp.json";
const TOML_FILE: &str = "/etc/tether/tether.toml";

fn json(text: &str) -> Result<LoadedConfig, ConfigError> {
    parse(text, Format::McpServersJson, JSON_FILE, &env)
}

fn vscode(text: &str) -> Result<LoadedConfig, ConfigError> {
    parse(text, Format::VsCodeJson, VSCODE_FILE, &env)
}

fn toml(text: &str) -> Result<LoadedConfig, ConfigError> {
    parse(text, Format::Toml, TOML_FILE, &env)
}

fn json_err(text: &str) -> ConfigError {
    json(text).expect_err("expected an error")
}

fn toml_err(text: &str) -> ConfigError {
    toml(text).expect_err("expected an error")
}

/// The message starts with the file and names the server and key; no secret leaks.
fn assert_names(err: &ConfigError, file: &str, server: Option<&str>, key: Option<&str>) {
    let msg = err.to_string();
    assert!(msg.starts_with(file), "no file in: {msg}");
    assert_eq!(err.file(), file);
    if let Some(server) = server {
        assert!(
            msg.contains(&format!("server `{server}`")),
            "no server in: {msg}"
        );
    }
    assert_eq!(err.server(), server, "{msg}");
    if let Some(key) = key {
        assert!(msg.contains(&format!("key `{key}`")), "no key in: {msg}");
        assert_eq!(err.key(), Some(key), "{msg}");
    }
    assert!(!msg.contains(SECRET), "secret leaked: {msg}");
}

fn only(config: &LoadedConfig) -> &ServerSpec {
    assert_eq!(config.servers.len(), 1, "{config:?}");
    &config.servers[0]
}

fn stdio(spec: &ServerSpec) -> (&str, &[String], &BTreeMap<String, String>, Option<&Path>) {
    match &spec.transport {
        TransportSpec::Stdio {
            command,
            args,
            env,
            cwd,
        } => (command, args, env, cwd.as_deref()),
        other => panic!("not stdio: {other:?}"),
    }
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "tether-config-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---- formats ----

#[test]
fn mcp_servers_json_stdio_server() {
    let config = json(
        r#"{"mcpServers": {"files": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
            "env": {"FOO": "bar"},
            "cwd": "/srv"
        }}}"#,
    )
    .unwrap();
    let spec = only(&config);
    assert_eq!(spec.name, "files");
    let (command, args, env, cwd) = stdio(spec);
    assert_eq!(command, "npx");
    assert_eq!(
        args,
        ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]
    );
    assert_eq!(env, &map(&[("FOO", "bar")]));
    assert_eq!(cwd, Some(Path::new("/srv")));
    assert_eq!(spec.timeouts, Timeouts::default());
    assert!(spec.include.is_empty() && spec.exclude.is_empty());
    assert_eq!(spec.policy_settings, None);
    assert_eq!(config.policy_settings, None);
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

#[test]
fn mcp_servers_json_http_types() {
    let config = json(
        r#"{"mcpServers": {
            "auto": {"url": "http://127.0.0.1:1/mcp", "headers": {"X-A": "1"}},
            "http": {"url": "http://127.0.0.1:2/mcp", "type": "http"},
            "kebab": {"url": "http://127.0.0.1:3/mcp", "type": "streamable-http"},
            "camel": {"url": "http://127.0.0.1:4/mcp", "type": "streamableHttp"},
            "snake": {"url": "http://127.0.0.1:5/mcp", "type": "streamable_http"},
            "legacy": {"url": "https://example.com/sse", "type": "sse"},
            "child": {"command": "srv", "type": "stdio"}
        }}"#,
    )
    .unwrap();
    let t: Vec<_> = config.servers.iter().map(|s| &s.transport).collect();
    assert_eq!(
        t[0],
        &TransportSpec::Http {
            url: "http://127.0.0.1:1/mcp".into(),
            headers: map(&[("X-A", "1")]),
            sse_fallback: true,
        }
    );
    for (i, port) in [(1, 2), (2, 3), (3, 4), (4, 5)] {
        assert_eq!(
            t[i],
            &TransportSpec::Http {
                url: format!("http://127.0.0.1:{port}/mcp"),
                headers: BTreeMap::new(),
                sse_fallback: false,
            }
        );
    }
    assert_eq!(
        t[5],
        &TransportSpec::Sse {
            url: "https://example.com/sse".into(),
            headers: BTreeMap::new(),
        }
    );
    assert!(matches!(t[6], TransportSpec::Stdio { .. }));
}

#[test]
fn mcp_servers_json_timeout_is_call_deadline_in_ms() {
    let config = json(
        r#"{"mcpServers": {
            "a": {"command": "x", "timeout": 60000},
            "b": {"command": "x", "timeout": 7200000}
        }}"#,
    )
    .unwrap();
    assert_eq!(config.servers[0].timeouts.call, Duration::from_secs(60));
    assert_eq!(
        config.servers[0].timeouts.call_max,
        Timeouts::default().call_max
    );
    // A call deadline beyond the default total raises the total with it.
    assert_eq!(config.servers[1].timeouts.call, Duration::from_secs(7200));
    assert_eq!(
        config.servers[1].timeouts.call_max,
        Duration::from_secs(7200)
    );
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

#[test]
fn json_formats_accept_tether_extras() {
    let text = r#"{"policy": {"backoff": {"base_ms": 500}},
        "SERVERS": {
        "files": {
            "type": "stdio", "command": "srv",
            "include": ["read_*"], "exclude": ["write_*"],
            "timeouts": {"connect": "10s", "call": 90000, "call_max": "2h",
                         "keepalive": "1m", "keepalive_deadline": 5000,
                         "reconnect_wait": "1s 500ms", "stop_grace": "250ms",
                         "max_tool_pages": 7},
            "policy": {"reconnect_budget": 3},
            "disabled": false
        },
        "off": {"command": "srv", "disabled": true}
    }}"#;
    let expected_timeouts = Timeouts {
        connect: Duration::from_secs(10),
        call: Duration::from_secs(90),
        call_max: Duration::from_secs(7200),
        keepalive_interval: Duration::from_secs(60),
        keepalive_deadline: Duration::from_secs(5),
        reconnect_wait: Duration::from_millis(1500),
        stop_grace: Duration::from_millis(250),
        max_tool_pages: 7,
    };
    for (format, key) in [
        (Format::McpServersJson, "mcpServers"),
        (Format::VsCodeJson, "servers"),
    ] {
        let text = text.replace("SERVERS", key);
        let config = parse(&text, format, JSON_FILE, &env).unwrap();
        let spec = only(&config);
        assert_eq!(spec.include, ["read_*"]);
        assert_eq!(spec.exclude, ["write_*"]);
        assert_eq!(spec.timeouts, expected_timeouts);
        assert_eq!(spec.policy_settings, Some(json!({"reconnect_budget": 3})));
        assert_eq!(
            config.policy_settings,
            Some(json!({"backoff": {"base_ms": 500}}))
        );
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    }
}

#[test]
fn vscode_json_servers() {
    let config = vscode(
        r#"{
        // VS Code files are JSONC
        "inputs": [{"type": "promptString", "id": "api-key", "password": true}],
        "servers": {
            "local": {"type": "stdio", "command": "node", "args": ["${workspaceFolder}/srv.js"]},
            "remote": {"type": "http", "url": "https://example.com/mcp",
                       "headers": {"Authorization": "Bearer ${env:TOKEN}"}},
            "legacy": {"type": "sse", "url": "https://example.com/sse"},
        },
    }"#,
    )
    .unwrap();
    assert_eq!(config.servers.len(), 3);
    let (command, args, _, _) = stdio(&config.servers[0]);
    assert_eq!(command, "node");
    // `.vscode/mcp.json` lives in the workspace folder's `.vscode`.
    assert_eq!(args, ["/ws/srv.js"]);
    assert_eq!(
        config.servers[1].transport,
        TransportSpec::Http {
            url: "https://example.com/mcp".into(),
            headers: map(&[("Authorization", &format!("Bearer {SECRET}"))]),
            sse_fallback: true,
        }
    );
    assert!(matches!(
        config.servers[2].transport,
        TransportSpec::Sse { .. }
    ));
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
    let warning = &config.warnings[0];
    assert!(warning.starts_with(VSCODE_FILE), "{warning}");
    assert!(warning.contains("key `inputs`"), "{warning}");
}

#[test]
fn vscode_env_file_is_merged_under_env() {
    let dir = TempDir::new();
    dir.write(
        "secrets.env",
        "# comment\n\nexport A=from-file\nB=\"quoted value\" # a note\nC='single'\ngarbage\n",
    );
    let path = dir
        .write(
            ".vscode/mcp.json",
            r#"{"servers": {"s": {"type": "stdio", "command": "x",
            "envFile": "${workspaceFolder}/secrets.env", "env": {"A": "explicit"}}}}"#,
        )
        .display()
        .to_string();
    let text = std::fs::read_to_string(&path).unwrap();
    let config = parse(&text, Format::VsCodeJson, &path, &env).unwrap();
    let (_, _, env, _) = stdio(only(&config));
    assert_eq!(
        env,
        &map(&[("A", "explicit"), ("B", "quoted value"), ("C", "single")])
    );
    assert!(
        config
            .warnings
            .iter()
            .any(|w| w.contains("envFile") && w.contains("line 6 defines nothing")),
        "{:?}",
        config.warnings
    );
}

#[test]
fn toml_full_example() {
    let config = toml(
        r#"
[policy]
backoff = { base_ms = 1000 }
started = 2024-01-01T00:00:00Z

[servers.files]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]
env = { FOO = "bar" }
cwd = "/tmp"
include = ["read_*"]
exclude = ["write_*"]

[servers.files.timeouts]
connect = "30s"
call = "300s"
call_max = "1h"
keepalive = "180s"
keepalive_deadline = "30s"
reconnect_wait = "15s"
stop_grace = 2000

[servers.files.policy]
reconnect_budget = 3
ratio = 0.5

[servers.web]
url = "http://127.0.0.1:${PORT}/mcp"
headers = { Authorization = "Bearer ${TOKEN}" }
"#,
    )
    .unwrap();
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    assert_eq!(
        config.policy_settings,
        Some(json!({"backoff": {"base_ms": 1000}, "started": "2024-01-01T00:00:00Z"}))
    );
    let files = &config.servers[0];
    assert_eq!(files.name, "files");
    let (command, args, env, cwd) = stdio(files);
    assert_eq!(command, "npx");
    assert_eq!(args.len(), 3);
    assert_eq!(env, &map(&[("FOO", "bar")]));
    assert_eq!(cwd, Some(Path::new("/tmp")));
    assert_eq!(files.include, ["read_*"]);
    assert_eq!(files.exclude, ["write_*"]);
    assert_eq!(files.timeouts, Timeouts::default());
    assert_eq!(
        files.policy_settings,
        Some(json!({"reconnect_budget": 3, "ratio": 0.5}))
    );
    assert_eq!(
        config.servers[1].transport,
        TransportSpec::Http {
            url: "http://127.0.0.1:8080/mcp".into(),
            headers: map(&[("Authorization", &format!("Bearer {SECRET}"))]),
            sse_fallback: true,
        }
    );
}

#[test]
fn toml_http_types() {
    let config = toml(
        r#"
[servers.a]
url = "http://h/mcp"
type = "http"
[servers.b]
url = "http://h/sse"
type = "sse"
"#,
    )
    .unwrap();
    assert!(matches!(
        config.servers[0].transport,
        TransportSpec::Http {
            sse_fallback: false,
            ..
        }
    ));
    assert!(matches!(
        config.servers[1].transport,
        TransportSpec::Sse { .. }
    ));
}

#[test]
fn toml_without_servers_is_empty() {
    let config = toml("[policy]\nx = 1\n").unwrap();
    assert!(config.servers.is_empty());
    assert_eq!(config.policy_settings, Some(json!({"x": 1})));
}

#[test]
fn servers_keep_file_order() {
    let names =
        |c: LoadedConfig| -> Vec<String> { c.servers.into_iter().map(|s| s.name).collect() };
    let from_json =
        json(r#"{"mcpServers": {"zeta": {"command": "x"}, "alpha": {"command": "x"}, "mid": {"command": "x"}}}"#)
            .unwrap();
    assert_eq!(names(from_json), ["zeta", "alpha", "mid"]);
    let from_toml = toml(
        "[servers.zeta]\ncommand = \"x\"\n[servers.alpha]\ncommand = \"x\"\n[servers.mid]\ncommand = \"x\"\n",
    )
    .unwrap();
    assert_eq!(names(from_toml), ["zeta", "alpha", "mid"]);
}

// ---- expansion ----

#[test]
fn expansion_applies_to_every_string_field() {
    let config = json(
        r#"{"mcpServers": {
        "s": {"command": "${env:TOKEN}-cmd", "args": ["--port", "${PORT}", "${NOPE:-dflt}"],
              "env": {"K": "v=${TOKEN}", "E": "${EMPTY:-was-empty}"}, "cwd": "/srv/${PORT}"},
        "h": {"url": "http://localhost:${PORT}/mcp?k=${TOKEN}",
              "headers": {"Authorization": "Bearer ${TOKEN}"}}
    }}"#,
    )
    .unwrap();
    let (command, args, env, cwd) = stdio(&config.servers[0]);
    assert_eq!(command, format!("{SECRET}-cmd"));
    assert_eq!(args, ["--port", "8080", "dflt"]);
    assert_eq!(
        env,
        &map(&[("K", &format!("v={SECRET}")), ("E", "was-empty")])
    );
    assert_eq!(cwd, Some(Path::new("/srv/8080")));
    assert_eq!(
        config.servers[1].transport,
        TransportSpec::Http {
            url: format!("http://localhost:8080/mcp?k={SECRET}"),
            headers: map(&[("Authorization", &format!("Bearer {SECRET}"))]),
            sse_fallback: true,
        }
    );
}

#[test]
fn expansion_skips_globs_and_policy_and_keys() {
    let config = toml(
        r#"
[servers.s]
command = "x"
include = ["${TOKEN}"]
env = { "${TOKEN}" = "v" }
policy = { note = "${TOKEN}" }
"#,
    )
    .unwrap();
    let spec = only(&config);
    assert_eq!(spec.include, ["${TOKEN}"]);
    assert_eq!(spec.policy_settings, Some(json!({"note": "${TOKEN}"})));
    let (_, _, env, _) = stdio(spec);
    assert!(env.contains_key("${TOKEN}"));
}

// ---- errors ----

#[test]
fn error_syntax_json_has_file_line_column() {
    let err = json_err("{\"mcpServers\": {\n  \"a\": {\"command\": \"x\",,}\n}}");
    let ConfigError::Syntax {
        line,
        column,
        language,
        ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!((*line, *language), (2, "JSON"));
    assert!(*column > 1);
    assert!(
        err.to_string()
            .starts_with(&format!("{JSON_FILE}:2:{column}: invalid JSON: ")),
        "{err}"
    );
}

#[test]
fn error_syntax_toml_has_file_line_column() {
    let err = toml_err("[servers.a]\ncommand = \"x\"\nargs = [\n");
    let ConfigError::Syntax { line, language, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(*language, "TOML");
    assert!(*line >= 3, "{err}");
    assert!(
        err.to_string().starts_with(&format!("{TOML_FILE}:{line}:")),
        "{err}"
    );
    assert!(!err.to_string().contains('\n'), "{err}");
}

#[test]
fn error_duplicate_server_in_json() {
    let err = json_err(r#"{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}"#);
    assert!(matches!(err, ConfigError::Syntax { .. }), "{err:?}");
    assert!(err.to_string().contains("duplicate key `a`"), "{err}");
}

#[test]
fn error_unknown_extension() {
    let err = load(Path::new("/etc/tether/config.yaml")).unwrap_err();
    assert!(
        matches!(err, ConfigError::UnknownExtension { .. }),
        "{err:?}"
    );
    assert_names(&err, "/etc/tether/config.yaml", None, None);
}

#[test]
fn error_read_missing_file() {
    let dir = TempDir::new();
    let path = dir.0.join("missing.toml");
    let err = load(&path).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }), "{err:?}");
    assert_names(&err, &path.display().to_string(), None, None);
    // Reported with its cause chain (as `tether serve` does), the cause appears once.
    let chained = format!("{:#}", anyhow::Error::from(err));
    assert_eq!(
        chained.matches("No such file or directory").count(),
        1,
        "{chained}"
    );
}

#[test]
fn error_unknown_json_layout() {
    let dir = TempDir::new();
    let path = dir.write("other.json", r#"{"mcp": {"servers": {}}}"#);
    let err = load(&path).unwrap_err();
    assert!(matches!(err, ConfigError::UnknownLayout { .. }), "{err:?}");
    assert_names(&err, &path.display().to_string(), None, None);
    assert!(err.to_string().contains("mcpServers"), "{err}");
}

#[test]
fn error_missing_servers_key_in_explicit_format() {
    let err = vscode(r#"{"inputs": []}"#).unwrap_err();
    assert!(matches!(err, ConfigError::Missing { .. }), "{err:?}");
    assert_names(&err, VSCODE_FILE, None, Some("servers"));
}

#[test]
fn error_wrong_type_names_server_key_and_expectation() {
    let err = json_err(r#"{"mcpServers": {"s": {"command": "x", "args": "-y"}}}"#);
    assert_names(&err, JSON_FILE, Some("s"), Some("args"));
    assert!(
        err.to_string()
            .ends_with("expected an array of strings, found a string"),
        "{err}"
    );

    let err = json_err(r#"{"mcpServers": {"s": {"command": "x", "args": ["a", 1]}}}"#);
    assert_names(&err, JSON_FILE, Some("s"), Some("args[1]"));
    assert!(
        err.to_string()
            .ends_with("expected a string, found a number")
    );

    let err = toml_err("[servers.s]\ncommand = \"x\"\nenv = { PORT = 8080 }\n");
    assert_names(&err, TOML_FILE, Some("s"), Some("env.PORT"));
    assert!(
        err.to_string()
            .ends_with("expected a string, found an integer")
    );

    let err = toml_err("[servers.s]\ncommand = \"x\"\ndisabled = \"yes\"\n");
    assert_names(&err, TOML_FILE, Some("s"), Some("disabled"));

    let err = toml_err("servers = 3\n");
    assert_names(&err, TOML_FILE, None, Some("servers"));
    assert!(
        err.to_string()
            .ends_with("expected a table, found an integer")
    );

    let err = json_err(r#"{"mcpServers": {"s": "npx"}}"#);
    assert_names(&err, JSON_FILE, Some("s"), None);
    assert!(
        err.to_string()
            .ends_with("expected an object, found a string")
    );
}

#[test]
fn error_wrong_type_never_quotes_the_value() {
    let err = json_err(r#"{"mcpServers": {"s": {"command": "x", "env": "API_KEY=s3cr3t-value"}}}"#);
    assert_names(&err, JSON_FILE, Some("s"), Some("env"));
}

#[test]
fn error_missing_type_in_vscode() {
    let err = vscode(r#"{"servers": {"s": {"command": "x"}}}"#).unwrap_err();
    assert!(matches!(err, ConfigError::Missing { .. }), "{err:?}");
    assert_names(&err, VSCODE_FILE, Some("s"), Some("type"));
    assert!(err.to_string().contains("\"stdio\""), "{err}");
}

#[test]
fn error_invalid_server_name() {
    let too_long = "a".repeat(ServerSpec::MAX_NAME_LEN + 1);
    for name in ["my server", "a.b", "", "ünï", "a/b", too_long.as_str()] {
        let text = format!(r#"{{"mcpServers": {{"{name}": {{"command": "x"}}}}}}"#);
        let err = json_err(&text);
        assert!(matches!(err, ConfigError::InvalidName { .. }), "{err:?}");
        assert_eq!(err.server(), Some(name));
        let msg = err.to_string();
        assert!(msg.starts_with(JSON_FILE), "{msg}");
        assert!(msg.contains(&format!("server {name:?}")), "{msg}");
    }
    assert!(json(r#"{"mcpServers": {"Ok_name-2": {"command": "x"}}}"#).is_ok());
    let longest = "b".repeat(ServerSpec::MAX_NAME_LEN);
    assert!(
        json(&format!(
            r#"{{"mcpServers": {{"{longest}": {{"command": "x"}}}}}}"#
        ))
        .is_ok()
    );
}

#[test]
fn max_message_has_a_default_a_global_value_and_per_server_overrides() {
    let config = json(r#"{"mcpServers": {"s": {"command": "x"}}}"#).unwrap();
    assert_eq!(only(&config).max_message, 16 << 20);
    let config = toml(
        "max_message = \"2 MiB\"\n[servers.a]\ncommand = \"x\"\n\
         [servers.b]\ncommand = \"x\"\nmax_message = 65536\n\
         [servers.c]\ncommand = \"x\"\nmax_message = \"512KiB\"\n",
    )
    .unwrap();
    let sizes: Vec<usize> = config.servers.iter().map(|s| s.max_message).collect();
    assert_eq!(sizes, [2 << 20, 65536, 512 << 10]);
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

#[test]
fn error_bad_max_message() {
    for value in ["0", "-1", "\"lots\"", "true", "100", "\"2 GiB\""] {
        let err = json_err(&format!(
            r#"{{"mcpServers": {{"s": {{"command": "x", "max_message": {value}}}}}}}"#
        ));
        assert_names(&err, JSON_FILE, Some("s"), Some("max_message"));
    }
    let err = json_err(r#"{"max_message": "huge", "mcpServers": {"s": {"command": "x"}}}"#);
    assert_names(&err, JSON_FILE, None, Some("max_message"));
}

#[test]
fn the_protocol_generation_may_be_pinned_per_server() {
    let config = toml(
        "[servers.a]\ncommand = \"x\"\n\
         [servers.b]\ncommand = \"x\"\nprotocol = \"2026-07-28\"\n\
         [servers.c]\nurl = \"http://h/mcp\"\nprotocol = \"2025-11-25\"\n\
         [servers.d]\nurl = \"http://h/mcp\"\nprotocol = \"auto\"\n",
    )
    .unwrap();
    let choices: Vec<ProtocolChoice> = config.servers.iter().map(|s| s.protocol).collect();
    assert_eq!(
        choices,
        [
            ProtocolChoice::Auto,
            ProtocolChoice::Modern,
            ProtocolChoice::Legacy,
            ProtocolChoice::Auto
        ]
    );
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    for value in ["\"2024-11-05\"", "\"latest\"", "2026"] {
        let err = json_err(&format!(
            r#"{{"mcpServers": {{"s": {{"command": "x", "protocol": {value}}}}}}}"#
        ));
        assert_names(&err, JSON_FILE, Some("s"), Some("protocol"));
    }
    let err = json_err(
        r#"{"mcpServers": {"s": {"type": "sse", "url": "http://h/sse", "protocol": "2026-07-28"}}}"#,
    );
    assert_names(&err, JSON_FILE, Some("s"), Some("protocol"));
    assert!(err.to_string().contains("legacy SSE"), "{err}");
}

#[test]
fn a_prefix_names_a_servers_tools_and_a_top_level_prefix_is_every_servers_default() {
    let config = toml(
        "prefix = \"all-\"\n\
         [servers.a]\ncommand = \"x\"\n\
         [servers.b]\ncommand = \"x\"\nprefix = \"\"\n\
         [servers.c]\ncommand = \"x\"\nprefix = \"c.\"\n",
    )
    .unwrap();
    let prefixes: Vec<Option<&str>> = config.servers.iter().map(|s| s.prefix.as_deref()).collect();
    assert_eq!(prefixes, [Some("all-"), Some(""), Some("c.")]);
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    let config =
        json(r#"{"mcpServers": {"s": {"command": "x", "prefix": ""}, "t": {"command": "x"}}}"#)
            .unwrap();
    let prefixes: Vec<Option<&str>> = config.servers.iter().map(|s| s.prefix.as_deref()).collect();
    assert_eq!(prefixes, [Some(""), None]);
    assert_eq!(
        config.servers[0].policy_config().prefix.as_deref(),
        Some("")
    );
    let config =
        vscode(r#"{"servers": {"s": {"type": "stdio", "command": "x", "prefix": "v_"}}}"#).unwrap();
    assert_eq!(only(&config).prefix.as_deref(), Some("v_"));
    for value in ["1", "true", &format!("\"{}\"", "p".repeat(65))] {
        let err = json_err(&format!(
            r#"{{"mcpServers": {{"s": {{"command": "x", "prefix": {value}}}}}}}"#
        ));
        assert_names(&err, JSON_FILE, Some("s"), Some("prefix"));
    }
    let err = toml_err("prefix = 3\n[servers.a]\ncommand = \"x\"\n");
    assert_names(&err, TOML_FILE, None, Some("prefix"));
}

#[test]
fn error_both_command_and_url() {
    let err = json_err(r#"{"mcpServers": {"s": {"command": "x", "url": "http://h/"}}}"#);
    assert!(matches!(err, ConfigError::Transport { .. }), "{err:?}");
    assert_names(&err, JSON_FILE, Some("s"), None);
    assert!(
        err.to_string().contains("both `command` and `url`"),
        "{err}"
    );
}

#[test]
fn error_neither_command_nor_url() {
    let err = toml_err("[servers.s]\nargs = [\"x\"]\n");
    assert!(matches!(err, ConfigError::Transport { .. }), "{err:?}");
    assert_names(&err, TOML_FILE, Some("s"), None);
    assert!(err.to_string().contains("neither `command`"), "{err}");
}

#[test]
fn error_type_contradicts_transport() {
    let err = vscode(r#"{"servers": {"s": {"type": "http", "command": "x"}}}"#).unwrap_err();
    assert!(matches!(err, ConfigError::Transport { .. }), "{err:?}");
    assert_names(&err, VSCODE_FILE, Some("s"), None);
    assert!(err.to_string().contains("`type` is \"http\""), "{err}");
    let err = json_err(r#"{"mcpServers": {"s": {"type": "stdio", "url": "http://h/"}}}"#);
    assert_names(&err, JSON_FILE, Some("s"), None);
    assert!(err.to_string().contains("`type` is \"stdio\""), "{err}");
}

#[test]
fn error_unknown_type_value() {
    let err = json_err(r#"{"mcpServers": {"s": {"type": "websocket", "url": "ws://h/"}}}"#);
    assert!(matches!(err, ConfigError::InvalidValue { .. }), "{err:?}");
    assert_names(&err, JSON_FILE, Some("s"), Some("type"));
    assert!(err.to_string().contains("\"websocket\""), "{err}");
    // VS Code's schema has only stdio, http and sse.
    let err = vscode(r#"{"servers": {"s": {"type": "streamable-http", "url": "http://h/"}}}"#)
        .unwrap_err();
    assert_names(&err, VSCODE_FILE, Some("s"), Some("type"));
}

#[test]
fn error_unset_variable_names_the_variable() {
    let err = toml_err(
        "[servers.s]\nurl = \"http://h/\"\nheaders = { Authorization = \"Bearer ${API_TOKEN}\" }\n",
    );
    let ConfigError::UnsetVariable { var, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(var, "API_TOKEN");
    assert_names(&err, TOML_FILE, Some("s"), Some("headers.Authorization"));
    assert!(err.to_string().contains("`API_TOKEN` is not set"), "{err}");

    let err = json_err(r#"{"mcpServers": {"s": {"command": "x", "args": ["${env:NOPE}"]}}}"#);
    assert!(matches!(err, ConfigError::UnsetVariable { .. }), "{err:?}");
    assert_names(&err, JSON_FILE, Some("s"), Some("args[0]"));
}

#[test]
fn error_bad_reference_never_quotes_the_text() {
    let err =
        json_err(r#"{"mcpServers": {"s": {"command": "x", "env": {"K": "${s3cr3t-value"}}}}"#);
    assert!(matches!(err, ConfigError::BadReference { .. }), "{err:?}");
    assert_names(&err, JSON_FILE, Some("s"), Some("env.K"));
    assert!(err.to_string().contains("not closed"), "{err}");
}

#[test]
fn error_input_reference_is_unresolvable() {
    let err = vscode(
        r#"{"inputs": [{"id": "key", "type": "promptString"}],
            "servers": {"s": {"type": "stdio", "command": "x", "env": {"K": "${input:key}"}}}}"#,
    )
    .unwrap_err();
    assert!(matches!(err, ConfigError::BadReference { .. }), "{err:?}");
    assert_names(&err, VSCODE_FILE, Some("s"), Some("env.K"));
    assert!(err.to_string().contains("${input:key}"), "{err}");
}

#[test]
fn error_invalid_durations() {
    for (value, needle) in [
        ("\"soon\"", "invalid duration \"soon\""),
        ("\"0s\"", "greater than zero"),
        ("0", "greater than zero"),
        ("-5", "greater than zero"),
        ("\"400d\"", "too long"),
    ] {
        let err = toml_err(&format!(
            "[servers.s]\ncommand = \"x\"\ntimeouts = {{ connect = {value} }}\n"
        ));
        assert!(matches!(err, ConfigError::InvalidValue { .. }), "{err:?}");
        assert_names(&err, TOML_FILE, Some("s"), Some("timeouts.connect"));
        assert!(err.to_string().contains(needle), "{value}: {err}");
    }
    let err = toml_err("[servers.s]\ncommand = \"x\"\ntimeouts = { call = true }\n");
    assert!(matches!(err, ConfigError::WrongType { .. }), "{err:?}");
    assert_names(&err, TOML_FILE, Some("s"), Some("timeouts.call"));
    let err = toml_err("[servers.s]\ncommand = \"x\"\ntimeouts = { max_tool_pages = 0 }\n");
    assert_names(&err, TOML_FILE, Some("s"), Some("timeouts.max_tool_pages"));
}

#[test]
fn error_timeout_conflicts_with_timeouts_call() {
    let err = json_err(
        r#"{"mcpServers": {"s": {"command": "x", "timeout": 5000, "timeouts": {"call": "5s"}}}}"#,
    );
    assert!(matches!(err, ConfigError::InvalidValue { .. }), "{err:?}");
    assert_names(&err, JSON_FILE, Some("s"), Some("timeout"));
}

#[test]
fn error_call_exceeds_call_max() {
    let err =
        toml_err("[servers.s]\ncommand = \"x\"\ntimeouts = { call = \"2h\", call_max = \"1h\" }\n");
    assert_names(&err, TOML_FILE, Some("s"), Some("timeouts.call_max"));
    assert!(
        err.to_string()
            .contains("1h is shorter than the call deadline 2h"),
        "{err}"
    );
}

#[test]
fn error_invalid_url_never_quotes_it() {
    let err = json_err(r#"{"mcpServers": {"s": {"url": "${TOKEN}"}}}"#);
    assert!(matches!(err, ConfigError::InvalidValue { .. }), "{err:?}");
    assert_names(&err, JSON_FILE, Some("s"), Some("url"));
    let err = json_err(r#"{"mcpServers": {"s": {"url": "ftp://h/${TOKEN}"}}}"#);
    assert_names(&err, JSON_FILE, Some("s"), Some("url"));
    assert!(err.to_string().contains("http or https"), "{err}");
}

#[test]
fn error_invalid_header_never_quotes_it() {
    let err = json_err(
        r#"{"mcpServers": {"s": {"url": "http://h/", "headers": {"X-Key": "${BAD_HEADER}"}}}}"#,
    );
    assert!(matches!(err, ConfigError::InvalidValue { .. }), "{err:?}");
    assert_names(&err, JSON_FILE, Some("s"), Some("headers.X-Key"));
    let err = json_err(r#"{"mcpServers": {"s": {"url": "http://h/", "headers": {"X Key": "v"}}}}"#);
    assert_names(&err, JSON_FILE, Some("s"), Some("headers.X Key"));
}

#[test]
fn error_policy_must_be_an_object() {
    let err = json_err(r#"{"policy": [1], "mcpServers": {}}"#);
    assert!(matches!(err, ConfigError::WrongType { .. }), "{err:?}");
    assert_names(&err, JSON_FILE, None, Some("policy"));
    let err = toml_err("[servers.s]\ncommand = \"x\"\npolicy = { x = nan }\n");
    assert!(matches!(err, ConfigError::InvalidValue { .. }), "{err:?}");
    assert_names(&err, TOML_FILE, Some("s"), Some("policy"));
}

#[test]
fn error_empty_command() {
    let err = json_err(r#"{"mcpServers": {"s": {"command": "${EMPTY}"}}}"#);
    assert_names(&err, JSON_FILE, Some("s"), Some("command"));
    assert!(err.to_string().contains("must not be empty"), "{err}");
}

#[test]
fn error_env_file_unreadable() {
    let err = vscode(
        r#"{"servers": {"s": {"type": "stdio", "command": "x", "envFile": "/nonexistent/.env"}}}"#,
    )
    .unwrap_err();
    assert!(matches!(err, ConfigError::InvalidValue { .. }), "{err:?}");
    assert_names(&err, VSCODE_FILE, Some("s"), Some("envFile"));
    assert!(!err.to_string().contains("nonexistent"), "{err}");
}

// ---- warnings ----

#[test]
fn warnings_name_file_server_and_unknown_key() {
    let config = toml(
        r#"
log_level = "debug"
[servers.s]
command = "x"
autoApprove = ["t"]
[servers.s.timeouts]
keepalive_interval = "30s"
"#,
    )
    .unwrap();
    assert_eq!(
        config.warnings,
        [
            format!("{TOML_FILE}: unknown top-level key `log_level` (ignored)"),
            format!("{TOML_FILE}: server `s`, key `autoApprove`: unknown key (ignored)"),
            format!(
                "{TOML_FILE}: server `s`, key `timeouts.keepalive_interval`: unknown key (ignored)"
            ),
        ]
    );
    // `timeout` and `envFile` belong to the JSON formats only.
    let config = toml("[servers.s]\ncommand = \"x\"\ntimeout = 5000\n").unwrap();
    assert_eq!(
        config.warnings,
        [format!(
            "{TOML_FILE}: server `s`, key `timeout`: unknown key (ignored)"
        )]
    );
    assert_eq!(only(&config).timeouts, Timeouts::default());
}

#[test]
fn warnings_for_keys_of_the_other_transport() {
    let config = json(
        r#"{"mcpServers": {
        "h": {"url": "http://h/", "args": ["a"], "env": {"A": "${UNSET_BUT_IGNORED}"}},
        "c": {"command": "x", "headers": {"A": "b"}}
    }}"#,
    )
    .unwrap();
    assert_eq!(
        config.warnings,
        [
            format!(
                "{JSON_FILE}: server `h`, key `args`: applies only to stdio servers (`command`); ignored"
            ),
            format!(
                "{JSON_FILE}: server `h`, key `env`: applies only to stdio servers (`command`); ignored"
            ),
            format!(
                "{JSON_FILE}: server `c`, key `headers`: applies only to HTTP servers (`url`); ignored"
            ),
        ]
    );
}

#[test]
fn warning_for_a_sub_second_mcp_timeout() {
    let config = json(r#"{"mcpServers": {"s": {"command": "x", "timeout": 60}}}"#).unwrap();
    assert_eq!(only(&config).timeouts.call, Duration::from_millis(60));
    assert_eq!(config.warnings.len(), 1);
    let warning = &config.warnings[0];
    assert!(
        warning.starts_with(&format!("{JSON_FILE}: server `s`, key `timeout`: ")),
        "{warning}"
    );
    assert!(warning.contains("60000"), "{warning}");
}

#[test]
fn keepalive_floor_clamps_with_a_warning() {
    let config =
        toml("[servers.s]\ncommand = \"x\"\n[servers.s.timeouts]\nkeepalive = \"2s\"\n").unwrap();
    assert_eq!(
        only(&config).timeouts.keepalive_interval,
        Timeouts::KEEPALIVE_FLOOR
    );
    assert_eq!(
        config.warnings,
        [format!(
            "{TOML_FILE}: server `s`, key `timeouts.keepalive`: 2s is below the 5s floor; using 5s"
        )]
    );
    let config =
        json(r#"{"mcpServers": {"s": {"command": "x", "timeouts": {"keepalive": 5000}}}}"#)
            .unwrap();
    assert_eq!(
        only(&config).timeouts.keepalive_interval,
        Duration::from_secs(5)
    );
    assert!(config.warnings.is_empty());
}

#[test]
fn disabled_servers_are_skipped() {
    let config = json(
        r#"{"mcpServers": {
        "off": {"command": "x", "args": ["${NOT_SET}"], "disabled": true},
        "bad name but off": {"disabled": true},
        "on": {"command": "y", "disabled": false}
    }}"#,
    )
    .unwrap();
    assert_eq!(only(&config).name, "on");
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    let config = toml("[servers.off]\ndisabled = true\n").unwrap();
    assert!(config.servers.is_empty());
}

#[test]
fn relative_cwd_resolves_against_the_config_dir() {
    let config = toml(
        r#"
[servers.rel]
command = "x"
cwd = "data/${PORT}"
[servers.dot]
command = "x"
cwd = "../up"
[servers.abs]
command = "x"
cwd = "/abs"
"#,
    )
    .unwrap();
    let cwd = |i: usize| stdio(&config.servers[i]).3.map(Path::to_path_buf);
    assert_eq!(cwd(0), Some(PathBuf::from("/etc/tether/data/8080")));
    assert_eq!(cwd(1), Some(PathBuf::from("/etc/tether/../up")));
    assert_eq!(cwd(2), Some(PathBuf::from("/abs")));
    if let Some(home) = dirs::home_dir() {
        let config = toml("[servers.h]\ncommand = \"x\"\ncwd = \"~/proj\"\n").unwrap();
        assert_eq!(stdio(only(&config)).3, Some(home.join("proj").as_path()));
    }
}

#[test]
fn load_detects_the_format_and_resolves_cwd_against_the_file() {
    let dir = TempDir::new();
    let claude = dir.write(
        "claude.json",
        r#"{"mcpServers": {"a": {"command": "x", "cwd": "work"}}, "servers": {}}"#,
    );
    let config = load(&claude).unwrap();
    assert_eq!(stdio(only(&config)).3, Some(dir.0.join("work").as_path()));
    // `servers` is not a key of the mcpServers format.
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
    assert!(config.warnings[0].contains("`servers`"));

    let vscode = dir.write(
        "mcp.json",
        r#"{"servers": {"b": {"type": "sse", "url": "http://h/sse"}}}"#,
    );
    let config = load(&vscode).unwrap();
    assert!(matches!(only(&config).transport, TransportSpec::Sse { .. }));

    let tether = dir.write("tether.TOML", "[servers.c]\nurl = \"http://h/mcp\"\n");
    let config = load(&tether).unwrap();
    assert_eq!(only(&config).name, "c");
}

#[test]
fn an_oauth_table_configures_how_tether_authorizes_and_never_shows_its_secret() {
    let config = toml(
        "[servers.a]\nurl = \"https://h/mcp\"\n\
         [servers.a.oauth]\nclient_id = \"tether\"\nclient_secret = \"${TOKEN}\"\n\
         scopes = \"read write\"\ngrant = \"client_credentials\"\n\
         [servers.b]\nurl = \"https://h/mcp\"\n\
         [servers.c]\nurl = \"https://h/mcp\"\nheaders = { Authorization = \"Bearer x\" }\n",
    )
    .unwrap();
    let a = &config.servers[0];
    let oauth = a.oauth().expect("oauth on an HTTP server");
    assert_eq!(oauth.client_id.as_deref(), Some("tether"));
    assert_eq!(
        oauth.client_secret.as_ref().map(Secret::expose),
        Some(SECRET)
    );
    assert_eq!(oauth.scopes, ["read", "write"]);
    assert_eq!(oauth.grant, Grant::ClientCredentials);
    assert!(!format!("{a:?}").contains(SECRET), "{a:?}");
    // Without the table: the defaults (discovery, registration).
    assert_eq!(config.servers[1].oauth(), Some(OAuthConfig::default()));
    // A configured Authorization header is the server's credentials: no OAuth.
    assert_eq!(config.servers[2].oauth(), None);
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);

    let config = json(
        r#"{"mcpServers": {"s": {"url": "https://h/mcp", "oauth": {
            "scopes": ["mcp:basic"], "client_metadata_url": "https://tether.example/client.json"}}}}"#,
    )
    .unwrap();
    let oauth = only(&config).oauth().unwrap();
    assert_eq!(oauth.scopes, ["mcp:basic"]);
    assert_eq!(oauth.grant, Grant::AuthorizationCode);

    // Tokens over plain http off loopback are sent (as without Tether), with a warning naming
    // the server; on loopback, nothing to say.
    let config = toml(
        "[servers.far]\nurl = \"http://mcp.example:8080/mcp\"\noauth = {}\n\
         [servers.near]\nurl = \"http://127.0.0.1:8080/mcp\"\noauth = {}\n",
    )
    .unwrap();
    assert_eq!(config.servers.len(), 2);
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
    let warning = &config.warnings[0];
    assert!(
        warning.contains("server `far`") && warning.contains("plain http"),
        "{warning}"
    );

    for (oauth, key) in [
        (r#"{"grant": "password"}"#, "oauth.grant"),
        (
            r#"{"grant": "client_credentials", "client_id": "x"}"#,
            "oauth.grant",
        ),
        (r#"{"client_secret": "${TOKEN}"}"#, "oauth.client_secret"),
        (
            r#"{"client_metadata_url": "http://h/c.json"}"#,
            "oauth.client_metadata_url",
        ),
        (r#"{"scopes": 3}"#, "oauth.scopes"),
        (r#""x""#, "oauth"),
    ] {
        let err = json_err(&format!(
            r#"{{"mcpServers": {{"s": {{"url": "https://h/mcp", "oauth": {oauth}}}}}}}"#
        ));
        assert_names(&err, JSON_FILE, Some("s"), Some(key));
        assert!(!err.to_string().contains(SECRET), "{err}");
    }
    let err = json_err(
        r#"{"mcpServers": {"s": {"url": "https://h/mcp", "headers": {"authorization": "x"}, "oauth": {}}}}"#,
    );
    assert_names(&err, JSON_FILE, Some("s"), Some("oauth"));
    // On a stdio server it means nothing: a warning.
    let config = json(r#"{"mcpServers": {"s": {"command": "x", "oauth": {}}}}"#).unwrap();
    assert!(
        config.warnings.iter().any(|w| w.contains("oauth")),
        "{:?}",
        config.warnings
    );
}

#[test]
fn keep_connections_is_off_unless_asked_per_server_or_for_all() {
    let config = json(r#"{"mcpServers": {"a": {"url": "http://h/mcp"}}}"#).unwrap();
    assert!(!only(&config).keep_connections);
    let config = json(
        r#"{"keep_connections": true, "mcpServers": {
            "a": {"url": "http://h/mcp"},
            "b": {"url": "http://h/mcp", "keep_connections": false}}}"#,
    )
    .unwrap();
    let kept: Vec<_> = config.servers.iter().map(|s| s.keep_connections).collect();
    assert_eq!(kept, [true, false]);
    let config = toml("[servers.a]\nurl = \"https://h/mcp\"\nkeep_connections = true\n").unwrap();
    assert!(only(&config).keep_connections);
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    let config = toml("keep_connections = true\n[servers.a]\nurl = \"https://h/mcp\"\n").unwrap();
    assert!(only(&config).keep_connections);
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    let config = vscode(
        r#"{"keep_connections": true, "servers": {"a": {"type": "http", "url": "http://h/mcp"}}}"#,
    )
    .unwrap();
    assert!(only(&config).keep_connections);
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);

    let err = toml_err("[servers.a]\nurl = \"http://h/mcp\"\nkeep_connections = \"yes\"\n");
    assert_names(&err, TOML_FILE, Some("a"), Some("keep_connections"));
    assert!(
        err.to_string()
            .ends_with("expected a boolean, found a string"),
        "{err}"
    );
    // Stdio servers have no connections to keep: said, and left out of their spec (a reload
    // that changes it restarts none of them).
    let config = json(r#"{"mcpServers": {"s": {"command": "x", "keep_connections": true}}}"#);
    let config = config.unwrap();
    assert!(!only(&config).keep_connections);
    let warnings = &config.warnings;
    assert!(
        warnings.iter().any(|w| w.contains("keep_connections")),
        "{warnings:?}"
    );
    let config = json(r#"{"keep_connections": true, "mcpServers": {"s": {"command": "x"}}}"#);
    assert!(!only(&config.unwrap()).keep_connections);
}
