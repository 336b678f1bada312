//! A server behind OAuth, end to end: a real authorization server and protected MCP server
//! (`tests/python/oauth_server.py`, on the official Python SDK's `mcp.server.auth`) issuing
//! tokens that live two seconds; `tether auth login` with a browser command that follows
//! redirects; a headless `tether serve --http` that keeps calling across refreshes, parks with
//! the right fault when the grant is revoked, and revives when the login is done again.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::*;

/// The authorization + resource server, started on a free loopback port.
struct OAuthServer {
    child: Child,
    base: String,
    http: reqwest::Client,
}

impl OAuthServer {
    async fn start(token_lifetime: &str) -> OAuthServer {
        Self::start_with(token_lifetime, &[]).await
    }

    /// With `flags` for `oauth_server.py` (`--sse`: legacy HTTP+SSE at `/sse`).
    async fn start_with(token_lifetime: &str, flags: &[&str]) -> OAuthServer {
        let python = python_venv("mcp-1.30.0", "mcp==1.30.0", "constraints-1.txt")
            .join("bin")
            .join("python");
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("python")
            .join("oauth_server.py");
        let mut child = Command::new(python)
            .arg(script)
            .args(["--port", "0", "--token-lifetime", token_lifetime])
            .args(flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("the OAuth server starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let base = tokio::time::timeout(PATIENCE, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = line.strip_prefix("listening ") {
                    return url.to_string();
                }
            }
            panic!("the OAuth server ended without listening");
        })
        .await
        .expect("the OAuth server listens");
        OAuthServer {
            child,
            base,
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
        }
    }

    async fn stats(&self) -> Value {
        self.http
            .get(format!("{}/control/stats", self.base))
            .send()
            .await
            .expect("stats")
            .json()
            .await
            .expect("stats are JSON")
    }

    /// While `on`, the server answers MCP requests 401 with no challenge.
    async fn bare_401(&self, on: bool) {
        let answer = self
            .http
            .post(format!("{}/control/bare-401", self.base))
            .json(&json!({"on": on}))
            .send()
            .await
            .expect("bare-401");
        assert!(answer.status().is_success());
    }

    async fn revoke(&self) -> u64 {
        let answer: Value = self
            .http
            .post(format!("{}/control/revoke", self.base))
            .send()
            .await
            .expect("revoke")
            .json()
            .await
            .unwrap();
        answer["revoked"].as_u64().unwrap()
    }
}

/// One user's machine: its own state directory (tokens, gateway state files) and a browser
/// command that follows redirects.
struct Machine {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Machine {
    fn state_home(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// `tether ARGS` as this user, with `browser` as `$BROWSER` (or none).
    fn tether(&self, args: &[&str], browser: bool) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tether-cli"));
        command
            .args(args)
            .env("XDG_STATE_HOME", self.state_home())
            .env("RUST_LOG", "tether=debug")
            .env_remove("DISPLAY")
            .env_remove("TETHER_MCP_TOKEN")
            .env_remove("TETHER_ADMIN_TOKEN")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if browser {
            command.env(
                "BROWSER",
                format!("{} browse", env!("CARGO_BIN_EXE_conformance-client")),
            );
        } else {
            command.env_remove("BROWSER");
        }
        command
    }

    async fn run(&self, args: &[&str], browser: bool) -> std::process::Output {
        tokio::time::timeout(PATIENCE, self.tether(args, browser).output())
            .await
            .unwrap_or_else(|_| panic!("tether {args:?} took over {PATIENCE:?}"))
            .unwrap()
    }

    async fn login(&self) {
        let config = self.config.to_str().unwrap();
        let output = self
            .run(&["auth", "login", "remote", "--config", config], true)
            .await;
        assert!(
            output.status.success(),
            "tether auth login:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            String::from_utf8_lossy(&output.stdout).contains("authorized server \"remote\""),
            "{}",
            String::from_utf8_lossy(&output.stdout)
        );
    }

    async fn auth_status(&self) -> Value {
        let config = self.config.to_str().unwrap();
        let output = self
            .run(&["auth", "status", "--config", config, "--json"], false)
            .await;
        assert!(output.status.success());
        serde_json::from_slice(&output.stdout).expect("auth status --json is JSON")
    }

    /// The running gateway's view of `remote`.
    async fn server_status(&self) -> Value {
        let output = self.run(&["status", "--json"], false).await;
        let all: Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        all.as_array()
            .or_else(|| all["servers"].as_array())
            .into_iter()
            .flatten()
            .find(|server| server["name"] == "remote")
            .cloned()
            .unwrap_or_default()
    }

    /// `tether reload`, which must succeed; what it printed.
    async fn reload(&self) -> String {
        let output = self.run(&["reload"], false).await;
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// A headless `tether serve --http` (no browser) on this machine's config, and an agent
    /// that has seen `remote`'s tools.
    async fn serve_headless(&self) -> (HttpGateway, RunningService<RoleClient, Agent>) {
        let mut serve = self.tether(&["serve", "--http", "127.0.0.1:0"], false);
        serve
            .arg("--config")
            .arg(&self.config)
            .args(["--log-dir", self.dir.path().join("logs").to_str().unwrap()])
            .args(["--policy-settings", FAST_POLICY])
            .stderr(Stdio::piped());
        let gateway = start_http(serve).await;
        let client = Agent::default()
            .serve(StreamableHttpClientTransport::from_uri(gateway.url.clone()))
            .await
            .expect("MCP over HTTP");
        wait_for_tools(&client, "remote's tools are served", |t| {
            t.contains(&"remote__echo".to_string())
        })
        .await;
        (gateway, client)
    }

    /// Every token file with its mode, and the token directory's mode.
    fn token_files(&self) -> (u32, Vec<(PathBuf, u32)>) {
        let dir = self.state_home().join("tether").join("auth");
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let files = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|entry| entry.path())
            // Not the empty lock files that serialize refreshes.
            .filter(|path| path.is_file() && path.extension().is_some_and(|e| e == "json"))
            .map(|path| {
                let m = mode(&path);
                (path, m)
            })
            .collect();
        (mode(&dir), files)
    }

    /// The tokens and client secrets in the token files.
    fn stored_secrets(&self) -> BTreeSet<String> {
        self.token_files()
            .1
            .iter()
            .flat_map(|(path, _)| secret_values(&std::fs::read_to_string(path).unwrap()))
            .collect()
    }
}

/// Asserts that a refused call tells the agent which login helps.
fn names_the_login(refused: Result<String, String>, gateway: &HttpGateway) {
    assert!(
        refused
            .as_ref()
            .is_err_and(|words| words.contains("tether auth login remote")),
        "{refused:?}\n{}",
        gateway.stderr.lock().unwrap()
    );
}

/// Calls `echo` until the authorization server has refreshed `refreshes` more times, each call
/// answered and no refresh refused; how many calls that took.
async fn calls_across_refreshes(
    oauth: &OAuthServer,
    client: &RunningService<RoleClient, Agent>,
    gateway: &HttpGateway,
    refreshes: u64,
) -> usize {
    let stats = oauth.stats().await;
    let (at_start, failures) = (
        stats["refreshes"].as_u64().unwrap(),
        stats["refresh_failures"].clone(),
    );
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut calls = 0;
    loop {
        let text = format!("call {calls}");
        assert_eq!(
            echo(client, &text).await,
            Ok(text.clone()),
            "{}",
            gateway.stderr.lock().unwrap()
        );
        calls += 1;
        let stats = oauth.stats().await;
        if stats["refreshes"].as_u64().unwrap() >= at_start + refreshes {
            assert_eq!(stats["refresh_failures"], failures, "{stats}");
            return calls;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{refreshes} refreshes within {PATIENCE:?}: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn echo(client: &RunningService<RoleClient, Agent>, said: &str) -> Result<String, String> {
    let params = CallToolRequestParams::new("remote__echo")
        .with_arguments(args(json!({"text": said})).unwrap());
    match client.peer().call_tool(params).await {
        Ok(result) if result.is_error != Some(true) => Ok(text(&result)),
        Ok(result) => Err(text(&result)),
        Err(error) => Err(error.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_behind_oauth_stays_connected_across_refreshes_and_revives_after_a_new_login() {
    let oauth = OAuthServer::start("2").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tether.toml");
    // Only a URL: the server's 401 challenge says where to authorize.
    std::fs::write(
        &config,
        format!("[servers.remote]\nurl = \"{}/mcp\"\n", oauth.base),
    )
    .unwrap();
    let machine = Machine { dir, config };

    let before = machine.auth_status().await;
    assert_eq!(before[0]["server"], "remote", "{before}");
    assert_eq!(before[0]["authorized"], false, "{before}");

    // Authorization code with PKCE through a browser command that follows redirects.
    machine.login().await;
    let stats = oauth.stats().await;
    assert_eq!(stats["registrations"], 1, "{stats}");
    assert_eq!(stats["code_exchanges"], 1, "{stats}");
    let (dir_mode, files) = machine.token_files();
    assert_eq!(dir_mode, 0o700, "the token directory is private");
    assert!(!files.is_empty(), "the tokens are stored");
    for (path, mode) in &files {
        assert_eq!(*mode, 0o600, "{} is private", path.display());
    }
    let status = machine.auth_status().await;
    assert_eq!(status[0]["authorized"], true, "{status}");
    assert_eq!(status[0]["refreshable"], true, "{status}");
    // No secret of the store shows in the status: no quoted string of it longer than a word.
    let secrets = machine.stored_secrets();
    assert!(secrets.len() >= 2, "the store holds tokens");
    for secret in &secrets {
        assert!(
            !status.to_string().contains(secret.as_str()),
            "auth status shows a secret"
        );
    }

    // A headless gateway (no browser): it uses the stored tokens.
    let (gateway, client) = machine.serve_headless().await;

    // Tokens live two seconds: calls keep working across three refreshes, nothing withdrawn.
    let calls = calls_across_refreshes(&oauth, &client, &gateway, 3).await;
    assert!(calls >= 3);
    // The gateway logs every change of the visible tools: one, the first publication.
    let view = machine.server_status().await;
    let log = gateway.stderr.lock().unwrap().clone();
    assert_eq!(
        log.matches("visible tools changed").count(),
        1,
        "a refresh withdrew or republished tools: {view}\n{log}"
    );
    assert_eq!(
        (&view["parks"], &view["reconnects"]),
        (&json!(0), &json!(1)),
        "{view}"
    );

    // The grant is revoked: the server parks with the fault that says what to do. The call
    // names the login whether it meets the refused refresh itself or the park a background
    // refresh already caused.
    assert!(oauth.revoke().await > 0);
    names_the_login(echo(&client, "revoked").await, &gateway);
    let parked = wait_for(
        "remote parks",
        || machine.server_status(),
        |view| view["state"] == "parked",
    )
    .await;
    wait_for_tools(&client, "remote's tools are withdrawn", |t| {
        !t.contains(&"remote__echo".to_string())
    })
    .await;
    let fault = format!("{} {}", parked["detail"], parked["last_fault"]);
    assert!(
        fault.contains("refused to refresh") && fault.contains("tether auth login remote"),
        "{parked}"
    );
    // Parked means quiet: no self-probe (the policy heard that only a login helps, contract
    // 0.2.2; its probes would come every 0.3-0.6 s), no refresh, no registration.
    assert!(
        parked["detail"].as_str().unwrap().contains("no self-probe"),
        "{parked}"
    );
    let quiet = oauth.stats().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let still = oauth.stats().await;
    let view = machine.server_status().await;
    assert_eq!(view["reconnects"], parked["reconnects"], "{view}");
    assert_eq!(view["state"], "parked", "{view}");
    assert_eq!(quiet["refreshes"], still["refreshes"], "{still}");
    assert_eq!(
        quiet["refresh_failures"], still["refresh_failures"],
        "{still}"
    );
    assert_eq!(still["registrations"], 1, "{still}");

    // A new login revives it in the running gateway at once.
    machine.login().await;
    wait_for_tools(&client, "remote's tools are back", |t| {
        t.contains(&"remote__echo".to_string())
    })
    .await;
    assert_eq!(echo(&client, "after").await, Ok("after".to_string()));
    // That login registered another client: the running gateway refreshes its tokens as that
    // client (as the first, it would be refused: a login needed every token lifetime).
    let stats = oauth.stats().await;
    assert_eq!(stats["registrations"], 2, "{stats}");
    calls_across_refreshes(&oauth, &client, &gateway, 2).await;

    // The server (or a gateway in front of it) answers 401 with no challenge: the agent's call
    // and the status still say which login helps, and one revives the server.
    oauth.bare_401(true).await;
    names_the_login(echo(&client, "bare").await, &gateway);
    wait_for(
        "the fault names the login",
        || machine.server_status(),
        |view| {
            view["last_fault"]
                .as_str()
                .is_some_and(|fault| fault.contains("tether auth login remote"))
        },
    )
    .await;
    oauth.bare_401(false).await;
    machine.login().await;
    wait_for_tools(&client, "remote's tools are back after the bare 401", |t| {
        t.contains(&"remote__echo".to_string())
    })
    .await;
    assert_eq!(echo(&client, "again").await, Ok("again".to_string()));

    // Nothing secret reached the gateway's log.
    let log = gateway.stderr.lock().unwrap().clone();
    for secret in machine.stored_secrets().iter().chain(&secrets) {
        assert!(!log.contains(secret.as_str()), "the log shows a secret");
    }

    // Disabled, the server stops but is still in the config: its tokens stay (other gateways
    // of the user may use them; enabling it again needs no login).
    let kept = std::fs::read_to_string(&machine.config).unwrap();
    std::fs::write(&machine.config, format!("{kept}disabled = true\n")).unwrap();
    let said = machine.reload().await;
    assert!(said.contains("remote"), "{said}");
    assert_eq!(
        machine.token_files().1.len(),
        1,
        "a disabled server keeps its tokens"
    );

    // The server leaves the config: a reload stops it and forgets its tokens.
    std::fs::write(&machine.config, "[servers]\n").unwrap();
    machine.reload().await;
    assert!(
        machine.token_files().1.is_empty(),
        "a server that left the config keeps no tokens"
    );
    assert!(terminate(gateway.tether).await.success());

    // Logging out forgets the tokens.
    std::fs::write(&machine.config, kept).unwrap();
    machine.login().await;
    assert_eq!(machine.token_files().1.len(), 1);
    let config = machine.config.to_str().unwrap();
    let output = machine
        .run(&["auth", "logout", "remote", "--config", config], false)
        .await;
    assert!(output.status.success());
    assert!(
        machine.token_files().1.is_empty(),
        "logout removed the tokens"
    );
    assert_eq!(machine.auth_status().await[0]["authorized"], false);
    drop(oauth.child);
}

/// The values of `access_token`, `refresh_token` and `client_secret` anywhere in `json`.
fn secret_values(json: &str) -> BTreeSet<String> {
    fn walk(value: &Value, found: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    if let (
                        "access_token" | "refresh_token" | "client_secret",
                        Value::String(secret),
                    ) = (key.as_str(), value)
                    {
                        found.insert(secret.clone());
                    }
                    walk(value, found);
                }
            }
            Value::Array(items) => items.iter().for_each(|item| walk(item, found)),
            _ => {}
        }
    }
    let mut found = BTreeSet::new();
    if let Ok(value) = serde_json::from_str::<Value>(json) {
        walk(&value, &mut found);
    }
    found
}

/// A protected server whose authorization server misbehaves in the way `mode` names:
/// `malformed` metadata, an `insecure` token endpoint (plain http, not loopback), a token
/// endpoint that answers `html` or a `huge` body (5 MB).
async fn hostile_authorization_server() -> std::net::SocketAddr {
    use axum::extract::{Path as UrlPath, Query};
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    use axum::routing::{get, post};
    use std::collections::HashMap;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let base = format!("http://{addr}");
    let json = |body: String| ([(header::CONTENT_TYPE, "application/json")], body);
    let challenge = {
        let base = base.clone();
        move |UrlPath(mode): UrlPath<String>| {
            let base = base.clone();
            async move {
                (
                    StatusCode::UNAUTHORIZED,
                    [(
                        header::WWW_AUTHENTICATE,
                        format!(
                            "Bearer resource_metadata=\"{base}/.well-known/oauth-protected-resource/mcp/{mode}\""
                        ),
                    )],
                )
            }
        }
    };
    let resource = {
        let base = base.clone();
        move |UrlPath(mode): UrlPath<String>| {
            let base = base.clone();
            async move {
                json(
                    json!({"resource": format!("{base}/mcp/{mode}"),
                           "authorization_servers": [format!("{base}/{mode}")]})
                    .to_string(),
                )
            }
        }
    };
    let metadata = {
        let base = base.clone();
        move |UrlPath(mode): UrlPath<String>| {
            let base = base.clone();
            async move {
                if mode == "malformed" {
                    return json("{\"issuer\": [\"not\", \"a\", \"document\"".to_string());
                }
                let token = if mode == "insecure" {
                    "http://auth.example.com/token".to_string()
                } else {
                    format!("{base}/{mode}/token")
                };
                json(
                    json!({
                        "issuer": format!("{base}/{mode}"),
                        "authorization_endpoint": format!("{base}/{mode}/authorize"),
                        "token_endpoint": token,
                        "response_types_supported": ["code"],
                        "grant_types_supported": ["authorization_code", "refresh_token"],
                        "code_challenge_methods_supported": ["S256"],
                        "token_endpoint_auth_methods_supported": ["client_secret_post"],
                    })
                    .to_string(),
                )
            }
        }
    };
    let authorize = |Query(query): Query<HashMap<String, String>>| async move {
        let to = format!(
            "{}?code=the-code&state={}",
            query.get("redirect_uri").cloned().unwrap_or_default(),
            query.get("state").cloned().unwrap_or_default()
        );
        (StatusCode::FOUND, [(header::LOCATION, to)])
    };
    let token = |UrlPath(mode): UrlPath<String>| async move {
        if mode == "huge" {
            let body = format!("{{\"access_token\": \"{}\"}}", "x".repeat(5 << 20));
            return ([(header::CONTENT_TYPE, "application/json")], body).into_response();
        }
        (
            [(header::CONTENT_TYPE, "text/html")],
            "<html><body>Sign in to continue</body></html>".to_string(),
        )
            .into_response()
    };
    let app = axum::Router::new()
        .route("/mcp/{mode}", post(challenge.clone()).get(challenge))
        .route(
            "/.well-known/oauth-protected-resource/mcp/{mode}",
            get(resource),
        )
        .route(
            "/.well-known/oauth-authorization-server/{mode}",
            get(metadata),
        )
        .route("/{mode}/authorize", get(authorize))
        .route("/{mode}/token", post(token));
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Bad input from an authorization server ends the login with a fault that names the server
/// and the step, stores nothing, and shows no secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_authorization_server_gets_a_clear_fault_and_nothing_is_stored() {
    const SECRET: &str = "s3cr3t-of-the-client";
    let addr = hostile_authorization_server().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tether.toml");
    let modes = [
        ("malformed", "discovering the authorization server"),
        ("insecure", "neither https nor on loopback"),
        ("html", "exchanging the code for tokens"),
        ("huge", "exchanging the code for tokens"),
    ];
    let mut text = String::new();
    for (mode, _) in modes {
        text += &format!(
            "[servers.{mode}]\nurl = \"http://{addr}/mcp/{mode}\"\n[servers.{mode}.oauth]\nclient_id = \"tether-test\"\nclient_secret = \"{SECRET}\"\n"
        );
    }
    std::fs::write(&config, text).unwrap();
    let machine = Machine { dir, config };
    let config = machine.config.to_str().unwrap().to_string();
    for (mode, step) in modes {
        let output = machine
            .run(&["auth", "login", mode, "--config", &config], true)
            .await;
        let said = String::from_utf8_lossy(&output.stderr).to_string();
        assert!(!output.status.success(), "{mode}: {said}");
        let fault = said
            .lines()
            .find(|line| line.starts_with("tether: "))
            .unwrap_or_else(|| panic!("{mode}: no fault in {said}"));
        assert!(
            fault.contains(&format!("server \"{mode}\"")) && fault.contains(step),
            "{mode}: {fault}"
        );
        assert!(fault.len() < 600, "{mode}: a bounded message: {fault}");
        assert!(!said.contains(SECRET), "{mode}: the secret shows: {said}");
    }
    let stored = std::fs::read_dir(machine.state_home().join("tether").join("auth"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.path().extension().is_some_and(|e| e == "json"))
        .count();
    assert_eq!(stored, 0, "nothing is stored");
}

/// The library's authorizer of `oauth`'s server (as `remote`), its tokens in `store`, and a
/// browser command that follows redirects.
fn library_authorizer(
    oauth: &OAuthServer,
    store: Arc<dyn tether::auth::TokenStore>,
) -> (Arc<tether::auth::Authorizer>, Option<tether::auth::Browser>) {
    use tether::auth::{AuthContext, Authorizer, Browser};
    use tether::config::{ServerSpec, TransportSpec};
    let spec = ServerSpec::new(
        "remote",
        TransportSpec::Http {
            url: format!("{}/mcp", oauth.base),
            headers: Default::default(),
            sse_fallback: false,
        },
    );
    let context = AuthContext::new(store);
    let authorizer = Authorizer::for_server(&spec, Arc::new(context)).expect("an HTTP server");
    let browser = Browser::new(vec![
        env!("CARGO_BIN_EXE_conformance-client").to_string(),
        "browse".to_string(),
    ]);
    (authorizer, browser)
}

/// Requests that meet a 401 or 403 at once each ask for a login; the first one's tokens serve
/// them all: one login, one registration, one code exchanged (not a browser window each,
/// one after another).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_asked_for_at_once_make_one() {
    let oauth = OAuthServer::start("60").await;
    let store = Arc::new(tether::auth::MemoryTokenStore::default());
    let (authorizer, browser) = library_authorizer(&oauth, store);
    let show = |_: &str| {};
    let (first, second, third) = tokio::join!(
        authorizer.login(None, Vec::new(), browser.as_ref(), &show),
        authorizer.login(None, Vec::new(), browser.as_ref(), &show),
        authorizer.login(None, Vec::new(), browser.as_ref(), &show),
    );
    for outcome in [&first, &second, &third] {
        assert!(outcome.is_ok(), "{outcome:?}");
    }
    assert!(authorizer.status().authorized);
    let stats = oauth.stats().await;
    assert_eq!(
        (&stats["registrations"], &stats["code_exchanges"]),
        (&json!(1), &json!(1)),
        "{stats}"
    );
    drop(oauth.child);
}

/// A login stores its tokens under the lock a refresh holds from reading the tokens to storing
/// new ones: a refresh under way (here the lock held, as another gateway refreshing holds it)
/// is waited for, so that it cannot write older tokens back over the login's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_waits_for_a_refresh_under_way_before_it_stores_tokens() {
    use tether::auth::{FileTokenStore, TokenStore};

    let oauth = OAuthServer::start("60").await;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FileTokenStore::new(dir.path().join("auth")));
    let refreshing = store.lock("remote").unwrap().expect("a file store locks");
    let (authorizer, browser) = library_authorizer(&oauth, store.clone());
    let show = |_: &str| {};
    let login = authorizer.login(None, Vec::new(), browser.as_ref(), &show);
    let refresh_ends = async {
        let deadline = Instant::now() + PATIENCE;
        while oauth.stats().await["authorizations"] != 1 {
            assert!(Instant::now() < deadline, "the browser never authorized");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The code is on its way back to the login, which exchanges it within milliseconds
        // when nothing holds it up.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let stats = oauth.stats().await;
        assert_eq!(
            stats["code_exchanges"], 0,
            "exchanged during a refresh: {stats}"
        );
        let record = store.load("remote").unwrap().unwrap_or_default();
        let record = String::from_utf8_lossy(&record);
        assert!(
            !record.contains("access_token"),
            "stored during a refresh: {record}"
        );
        drop(refreshing);
    };
    let (outcome, ()) = tokio::join!(login, refresh_ends);
    assert!(outcome.is_ok(), "{outcome:?}");
    assert!(authorizer.status().authorized);
    assert_eq!(oauth.stats().await["code_exchanges"], 1);
    drop(oauth.child);
}

/// A legacy HTTP+SSE server behind OAuth: its POSTs carry the token as it is when each is
/// sent, refreshed before it expires, so calls go on across refreshes as over Streamable HTTP
/// (the token the stream opened with expires within the session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_sse_server_behind_oauth_stays_connected_across_refreshes() {
    let oauth = OAuthServer::start_with("2", &["--sse"]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tether.toml");
    std::fs::write(
        &config,
        format!(
            "[servers.remote]\ntype = \"sse\"\nurl = \"{}/sse\"\n",
            oauth.base
        ),
    )
    .unwrap();
    let machine = Machine { dir, config };
    machine.login().await;

    let (gateway, client) = machine.serve_headless().await;
    calls_across_refreshes(&oauth, &client, &gateway, 2).await;
    let view = machine.server_status().await;
    assert_eq!(view["parks"], json!(0), "{view}");
    assert!(terminate(gateway.tether).await.success());
    drop(oauth.child);
}
