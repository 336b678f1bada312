//! The browser half of a login: the person's browser opens the authorization URL, and the
//! authorization server redirects it to a listener on loopback that Tether starts for that
//! one redirect (a random port, `state` checked, closed after).

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::response::{Html, IntoResponse};
use tokio::sync::oneshot;

/// How the authorization URL reaches a browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Browser {
    /// The program and its arguments; `%s` in an argument is replaced by the URL, else the URL
    /// is appended.
    command: Vec<String>,
}

impl Browser {
    /// A browser command (`%s` stands for the URL).
    pub fn new(command: Vec<String>) -> Option<Self> {
        (!command.is_empty()).then_some(Self { command })
    }

    /// The user's browser: `$BROWSER` when set (its first `:`-separated entry), else the
    /// platform's opener when there is a display to open it on; `None` on a headless machine.
    pub fn from_env() -> Option<Self> {
        if let Some(entries) = std::env::var_os("BROWSER") {
            let entries = entries.to_string_lossy().into_owned();
            let first = entries.split(':').next().unwrap_or_default();
            return Self::new(first.split_whitespace().map(str::to_string).collect());
        }
        let opener = if cfg!(target_os = "macos") {
            "open"
        } else if std::env::var_os("DISPLAY").is_some()
            || std::env::var_os("WAYLAND_DISPLAY").is_some()
        {
            "xdg-open"
        } else {
            return None;
        };
        let on_path = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(opener).is_file()));
        on_path.then(|| Self {
            command: vec![opener.to_string()],
        })
    }

    /// Starts the browser on `url`; it runs on its own and is reaped when it exits.
    pub fn open(&self, url: &str) -> std::io::Result<()> {
        let mut args: Vec<String> = self.command[1..]
            .iter()
            .map(|arg| arg.replace("%s", url))
            .collect();
        if !self.command[1..].iter().any(|arg| arg.contains("%s")) {
            args.push(url.to_string());
        }
        let mut child = tokio::process::Command::new(&self.command[0])
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        Ok(())
    }
}

/// Why the redirect did not bring a code.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RedirectError {
    /// No listener could be started.
    #[error("cannot listen on loopback for the redirect: {0}")]
    Listen(String),
    /// Nobody came back in time.
    #[error("no redirect came back within {} s", .0.as_secs())]
    TimedOut(Duration),
    #[error(
        "the redirect carried a `state` that is not this login's (a stale or forged redirect); nothing was stored"
    )]
    /// A redirect of another login (or a forged one).
    WrongState,
    /// The authorization server said no (`error=`), or sent no code.
    #[error("the authorization server refused: {0}")]
    Refused(String),
}

/// A listener on `127.0.0.1` waiting for one redirect.
pub struct Redirect {
    listener: tokio::net::TcpListener,
    port: u16,
}

type Delivery = Arc<Mutex<Option<oneshot::Sender<Result<String, RedirectError>>>>>;

struct Expecting {
    state: String,
    port: u16,
    delivery: Delivery,
}

impl Redirect {
    /// Listens on a free port of 127.0.0.1.
    pub async fn bind() -> Result<Self, RedirectError> {
        let listener = tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .await
            .map_err(|error| RedirectError::Listen(error.to_string()))?;
        let port = listener
            .local_addr()
            .map_err(|error| RedirectError::Listen(error.to_string()))?
            .port();
        Ok(Self { listener, port })
    }

    /// The redirect URI to register and send.
    pub fn uri(&self) -> String {
        format!("http://127.0.0.1:{}/callback", self.port)
    }

    /// Waits for the redirect whose `state` is `state`; answers the browser, then closes.
    /// Returns the whole redirect URL (code, state, issuer).
    pub async fn wait(self, state: &str, within: Duration) -> Result<String, RedirectError> {
        let (sender, receiver) = oneshot::channel();
        let expecting = Arc::new(Expecting {
            state: state.to_string(),
            port: self.port,
            delivery: Arc::new(Mutex::new(Some(sender))),
        });
        let app = axum::Router::new()
            .route("/callback", axum::routing::get(callback))
            .with_state(expecting);
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(
            axum::serve(self.listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .into_future(),
        );
        let outcome = match tokio::time::timeout(within, receiver).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(RedirectError::Listen("the listener stopped".into())),
            Err(_) => Err(RedirectError::TimedOut(within)),
        };
        let _ = stop.send(());
        // The answer to the browser is sent before the listener goes; do not wait long.
        let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
        outcome
    }
}

async fn callback(
    State(expecting): State<Arc<Expecting>>,
    RawQuery(query): RawQuery,
) -> impl IntoResponse {
    let query = query.unwrap_or_default();
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let get = |key: &str| {
        pairs
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value.as_str())
    };
    let outcome = if get("state") != Some(expecting.state.as_str()) {
        Err(RedirectError::WrongState)
    } else if let Some(error) = get("error") {
        let description = get("error_description").unwrap_or_default();
        let words: String = format!("{error} {description}")
            .trim()
            .chars()
            .take(200)
            .collect();
        Err(RedirectError::Refused(words))
    } else if get("code").is_none() {
        Err(RedirectError::Refused(
            "the redirect carried no code".into(),
        ))
    } else {
        Ok(format!(
            "http://127.0.0.1:{}/callback?{query}",
            expecting.port
        ))
    };
    let page = match &outcome {
        Ok(_) => "Tether is authorized. You can close this window.".to_string(),
        Err(error) => format!("Tether was not authorized: {error}."),
    };
    if let Some(sender) = expecting
        .delivery
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        let _ = sender.send(outcome);
    }
    Html(format!(
        "<!doctype html><meta charset=utf-8><title>Tether</title><p>{}</p>",
        page.replace('<', "&lt;")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn follow(url: &str) -> reqwest::StatusCode {
        reqwest::get(url).await.unwrap().status()
    }

    #[tokio::test]
    async fn the_redirect_with_this_logins_state_brings_the_code() {
        let redirect = Redirect::bind().await.unwrap();
        let uri = redirect.uri();
        let waiting = tokio::spawn(redirect.wait("s1", Duration::from_secs(10)));
        assert!(
            follow(&format!("{uri}?code=c&state=s1&iss=x"))
                .await
                .is_success()
        );
        let url = waiting.await.unwrap().unwrap();
        assert!(url.ends_with("/callback?code=c&state=s1&iss=x"), "{url}");
    }

    #[tokio::test]
    async fn a_wrong_state_or_a_refusal_ends_the_wait_with_the_reason() {
        let redirect = Redirect::bind().await.unwrap();
        let uri = redirect.uri();
        let waiting = tokio::spawn(redirect.wait("s1", Duration::from_secs(10)));
        follow(&format!("{uri}?code=c&state=other")).await;
        assert_eq!(waiting.await.unwrap(), Err(RedirectError::WrongState));

        let redirect = Redirect::bind().await.unwrap();
        let uri = redirect.uri();
        let waiting = tokio::spawn(redirect.wait("s1", Duration::from_secs(10)));
        follow(&format!("{uri}?error=access_denied&state=s1")).await;
        assert_eq!(
            waiting.await.unwrap(),
            Err(RedirectError::Refused("access_denied".into()))
        );

        let redirect = Redirect::bind().await.unwrap();
        assert_eq!(
            redirect.wait("s1", Duration::from_millis(50)).await,
            Err(RedirectError::TimedOut(Duration::from_millis(50)))
        );
    }

    #[test]
    fn browser_commands_take_the_url_where_they_say() {
        let browser = Browser::new(vec!["b".into(), "--x=%s".into()]).unwrap();
        assert_eq!(browser.command, ["b", "--x=%s"]);
        assert!(Browser::new(Vec::new()).is_none());
    }
}
