//! `tether auth login|status|logout`: authorization of servers that use OAuth, done here and
//! kept in the token directory every gateway of this user reads. A login tells the running
//! gateways, which reconnect the server at once.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use tether::auth::{AuthContext, AuthStatus, Authorizer, Browser, FileTokenStore};
use tether::config::{Grant, ServerSpec};

use crate::state_file;

/// Where tokens are kept: `<state dir>/auth`, one file per server.
pub fn token_dir() -> PathBuf {
    state_file::state_dir().join("auth")
}

fn context(browser: Option<Browser>) -> Arc<AuthContext> {
    let mut context = AuthContext::new(Arc::new(FileTokenStore::new(token_dir())));
    context.browser = browser;
    Arc::new(context)
}

/// The config's servers, or the error printed.
fn servers(config: &Path) -> Result<Vec<ServerSpec>, ExitCode> {
    match tether::config::file::load(config) {
        Ok(loaded) => Ok(loaded.servers),
        Err(error) => {
            eprintln!("tether: {error}");
            Err(ExitCode::from(2))
        }
    }
}

/// The authorizer of server `name`, or the error printed.
fn authorizer(
    config: &Path,
    name: &str,
    browser: Option<Browser>,
) -> Result<(Arc<Authorizer>, ServerSpec), ExitCode> {
    let servers = servers(config)?;
    let Some(spec) = servers.into_iter().find(|spec| spec.name == name) else {
        eprintln!("tether: {}: no server named {name:?}", config.display());
        return Err(ExitCode::from(2));
    };
    match Authorizer::for_server(&spec, context(browser)) {
        Some(authorizer) => Ok((authorizer, spec)),
        None => {
            eprintln!(
                "tether: server {name:?} does not use OAuth: it is a stdio server, or its configured headers carry its credentials"
            );
            Err(ExitCode::from(2))
        }
    }
}

pub async fn login(config: &Path, name: &str, scopes: Vec<String>, no_browser: bool) -> ExitCode {
    let browser = if no_browser {
        None
    } else {
        Browser::from_env()
    };
    let (authorizer, spec) = match authorizer(config, name, browser.clone()) {
        Ok(found) => found,
        Err(code) => return code,
    };
    if spec
        .oauth()
        .is_some_and(|oauth| oauth.grant == Grant::ClientCredentials)
    {
        println!(
            "server {name:?} uses the client credentials grant: gateways obtain its tokens by themselves"
        );
        return ExitCode::SUCCESS;
    }
    let show = |url: &str| {
        eprintln!("Log in to server {name:?} at:\n\n  {url}\n");
        if browser.is_none() {
            eprintln!(
                "(no browser to open here: open the URL in a browser on this machine; the login waits for its redirect)"
            );
        }
    };
    match authorizer
        .login(None, scopes, browser.as_ref(), &show)
        .await
    {
        Ok(granted) => {
            let scopes = if granted.scopes.is_empty() {
                "no scopes named".to_string()
            } else {
                format!("scopes {}", granted.scopes.join(" "))
            };
            println!("authorized server {name:?} ({scopes})");
            tell_gateways(name).await;
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("tether: {why}");
            ExitCode::FAILURE
        }
    }
}

pub fn status(config: &Path, json: bool) -> ExitCode {
    let servers = match servers(config) {
        Ok(servers) => servers,
        Err(code) => return code,
    };
    let context = context(None);
    let statuses: Vec<AuthStatus> = servers
        .iter()
        .filter_map(|spec| Authorizer::for_server(spec, context.clone()))
        .map(|authorizer| authorizer.status())
        .collect();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&statuses).expect("statuses serialize")
        );
        return ExitCode::SUCCESS;
    }
    if statuses.is_empty() {
        println!("no server in {} can use OAuth", config.display());
    }
    for status in statuses {
        let mut line = format!(
            "{}: {}",
            status.server,
            if status.authorized {
                "authorized"
            } else {
                "not authorized"
            }
        );
        if !status.scopes.is_empty() {
            line += &format!(", scopes {}", status.scopes.join(" "));
        }
        if let Some(at) = status.expires_at {
            let left = tether::auth::expires_in(at);
            line += &if left > 0 {
                format!(
                    ", token expires in {}",
                    humantime::format_duration(std::time::Duration::from_secs(left as u64))
                )
            } else {
                ", token expired".to_string()
            };
        }
        if status.authorized {
            line += if status.refreshable {
                ", refreshable"
            } else {
                ", not refreshable"
            };
        }
        if let Some(issuer) = &status.issuer {
            line += &format!(", issued by {issuer}");
        }
        println!("{line}");
        if let Some(problem) = status.problem {
            println!("  {problem}");
        }
    }
    ExitCode::SUCCESS
}

pub async fn logout(config: &Path, name: &str) -> ExitCode {
    let (authorizer, _) = match authorizer(config, name, None) {
        Ok(found) => found,
        Err(code) => return code,
    };
    match authorizer.forget() {
        Ok(()) => {
            println!("forgot the tokens of server {name:?}");
            tell_gateways(name).await;
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("tether: {why}");
            ExitCode::FAILURE
        }
    }
}

/// Asks every running gateway to reconnect `name` (those without it answer 404).
async fn tell_gateways(name: &str) {
    let http = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(5))
        .no_proxy()
        .build()
        .expect("an HTTP client");
    let mut told = 0;
    for gateway in state_file::running() {
        let url = format!("http://{}/reconnect/{name}", gateway.state.addr);
        let answer = http
            .post(&url)
            .bearer_auth(&gateway.state.token)
            .send()
            .await;
        if answer.is_ok_and(|answer| answer.status().is_success()) {
            told += 1;
        }
    }
    if told > 0 {
        println!("reconnecting it in {told} running gateway(s)");
    }
}
