//! OAuth for upstream servers that demand it (MCP authorization: OAuth 2.1 with PKCE,
//! protected-resource and authorization-server discovery, dynamic client registration or a
//! client ID metadata document, resource indicators, scope step-up, refresh).
//!
//! rmcp's `auth` module does the protocol; this module decides when it runs and keeps its
//! results. One [`Authorizer`] per HTTP server lives as long as the server is configured:
//!
//! - Sessions sign their requests through it (`transport::oauth`); a token about to expire is
//!   refreshed before it is sent, and a 401 gets one refresh and one retry (rmcp's
//!   `AuthClient`). A refresh is invisible to supervision: the session and its tools stay.
//! - A 401 that no refresh cures makes the session's fault [`crate::policy::Fault::
//!   AuthorizationRequired`]: the policy parks the server (no reconnect storm, nothing sent to
//!   the authorization server) until a login completes, which revives it.
//! - A login ([`Authorizer::login`]) runs in `tether auth login NAME`, or by itself in the
//!   gateway the first time a server demands it when a browser is at hand ([`Browser`]).
//! - `insufficient_scope` gets one step-up (a login for the scopes held plus the ones named),
//!   never a loop: scopes already granted and still refused end it.
//! - Tokens live in a [`TokenStore`] (the CLI's: files of mode 0600 in a directory of mode
//!   0700); they never appear in logs, status, events, metrics, recordings or error texts.

pub mod login;
pub mod store;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use oauth2::TokenResponse;
use rmcp::transport::auth::{
    AuthClient, AuthError, AuthorizationManager, AuthorizationMetadata,
    AuthorizationMetadataResolution, AuthorizationRequest, AuthorizationSession,
    ClientCredentialsConfig, CredentialRefreshGuard, CredentialStore, OAuthClientConfig,
    WWWAuthenticateParams,
};
use serde::Serialize;
use tokio::sync::OnceCell;

pub use login::{Browser, RedirectError};
pub use store::{FileTokenStore, MemoryTokenStore, TokenStore};
use store::{Record, ServerTokens};

use crate::config::{Grant, OAuthConfig, ServerSpec, secure_enough};
use crate::transport::post::Posting;
use crate::transport::tls;

/// How long a login waits for the browser to come back.
pub const LOGIN_WAIT: Duration = Duration::from_secs(300);

/// The client name Tether registers under.
const CLIENT_NAME: &str = "Tether";

/// What every authorizer of a host shares: where tokens are kept, the browser (if any), and
/// whom to tell when a server became authorized.
pub struct AuthContext {
    /// Where tokens are kept.
    pub store: Arc<dyn TokenStore>,
    /// Opens authorization URLs; `None`: nobody to log in here (headless), so only `tether
    /// auth login` (or the library's [`Authorizer::login`]) authorizes.
    pub browser: Option<Browser>,
    /// Carries the server's name when a login completed in this process.
    pub authorized: tokio::sync::broadcast::Sender<String>,
    /// How long a login waits for the redirect.
    pub login_wait: Duration,
}

impl AuthContext {
    /// Tokens in `store`, no browser, the default login wait.
    pub fn new(store: Arc<dyn TokenStore>) -> Self {
        Self {
            store,
            browser: None,
            authorized: tokio::sync::broadcast::channel(64).0,
            login_wait: LOGIN_WAIT,
        }
    }
}

/// Why a server cannot be used until someone authorizes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// No tokens.
    Login,
    /// The authorization server refused to refresh the token (revoked or expired grant).
    RefreshRejected,
    /// A login was started in the browser and has not come back.
    LoginInProgress,
    /// A login or token request failed; the text names the step.
    Failed(String),
    /// The server demands scopes that the grant does not give.
    Scope(String),
}

/// What a failed request should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// New tokens came: send the request again (once).
    Retry,
    /// Nothing to do now: fail the request.
    GiveUp,
}

/// A completed authorization.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Granted {
    /// Scopes granted.
    pub scopes: Vec<String>,
    /// Unix seconds at which the access token expires, if the server said.
    pub expires_at: Option<u64>,
}

/// A server's authorization as operators see it: never a token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuthStatus {
    /// The server.
    pub server: String,
    /// Whether Tether holds an access token for the server.
    pub authorized: bool,
    /// Scopes granted.
    pub scopes: Vec<String>,
    /// Unix seconds at which the access token expires, if known.
    pub expires_at: Option<u64>,
    /// Whether a refresh token is held (the access token can be renewed without a login).
    pub refreshable: bool,
    /// The authorization server that issued the tokens.
    pub issuer: Option<String>,
    /// Why a login is needed, if one is.
    pub problem: Option<String>,
}

/// One server's authorization (see the module docs).
pub struct Authorizer {
    server: String,
    endpoint: String,
    config: OAuthConfig,
    tokens: ServerTokens,
    context: Arc<AuthContext>,
    /// Signs the requests of every session of the server; its manager is replaced when a
    /// login completes (each session sets its own HTTP client on a copy).
    signer: OnceCell<AuthClient<Posting>>,
    /// The client the shared manager is set up to refresh tokens for, from the stored record
    /// and validated metadata (`None`: not set up). A login elsewhere (`tether auth login`,
    /// another gateway) may store another client's tokens: then it is set up again.
    prepared_for: Mutex<Option<String>>,
    need: Mutex<Option<Need>>,
    /// The gateway starts a login by itself once, and again only after a request succeeded
    /// since (the authorization server changed, or the grant was revoked): never a loop of
    /// browser windows for a server that refuses whatever it is given.
    auto_login_spent: AtomicBool,
    /// One login or token request at a time.
    login_lock: tokio::sync::Mutex<()>,
    /// Tokens obtained in this process (logins and client-credentials grants): a request for
    /// tokens that waited while another obtained ones that will do takes those.
    grants: AtomicU64,
    /// Whether the operator was told that the server gets its tokens over plain http (set
    /// from the start when it does not).
    warned_in_clear: AtomicBool,
}

/// How long a request that met a 401 waits for the login the gateway opened: a browser that
/// completes it by itself (a single sign-on) lets the request go through; a person who needs
/// longer gets the fault, and the server comes back when the login completes.
const AUTO_LOGIN_PATIENCE: Duration = Duration::from_secs(10);

/// Unix seconds now.
fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// The first endpoint of `metadata` that is neither https nor loopback, by its field name.
fn insecure_endpoint(metadata: &AuthorizationMetadata) -> Option<&'static str> {
    [
        (
            "authorization_endpoint",
            Some(&metadata.authorization_endpoint),
        ),
        ("token_endpoint", Some(&metadata.token_endpoint)),
        (
            "registration_endpoint",
            metadata.registration_endpoint.as_ref(),
        ),
    ]
    .into_iter()
    .find_map(|(name, url)| url.filter(|url| !secure_enough(url)).map(|_| name))
}

impl Authorizer {
    /// The authorizer of `spec`, if it is an HTTP server that may use OAuth.
    pub fn for_server(spec: &ServerSpec, context: Arc<AuthContext>) -> Option<Arc<Self>> {
        let config = spec.oauth()?;
        let endpoint = spec.url()?.to_string();
        // Nothing to warn of for https or loopback: as if already warned.
        let warned_in_clear = AtomicBool::new(secure_enough(&endpoint));
        Some(Arc::new(Self {
            tokens: ServerTokens::new(context.store.clone(), &spec.name, &endpoint),
            server: spec.name.clone(),
            endpoint,
            config,
            context,
            signer: OnceCell::new(),
            prepared_for: Mutex::new(None),
            need: Mutex::new(None),
            auto_login_spent: AtomicBool::new(false),
            login_lock: tokio::sync::Mutex::new(()),
            grants: AtomicU64::new(0),
            warned_in_clear,
        }))
    }

    /// The server's name.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Whether this authorizer was made for `spec` as it is now (a reload that changes the
    /// URL or the `oauth` table needs a new one).
    pub fn serves(&self, spec: &ServerSpec) -> bool {
        spec.url() == Some(self.endpoint.as_str()) && spec.oauth().as_ref() == Some(&self.config)
    }

    fn set_need(&self, need: Option<Need>) {
        *self.need.lock().unwrap_or_else(|e| e.into_inner()) = need;
    }

    fn current_need(&self) -> Option<Need> {
        self.need.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A fresh manager for this server, reading and writing its tokens.
    async fn new_manager(&self) -> Result<AuthorizationManager, String> {
        let mut manager =
            AuthorizationManager::new_allowing_private_addresses(self.endpoint.as_str())
                .await
                .map_err(|error| self.words("setting up OAuth", &error))?;
        manager.set_credential_store(self.tokens.clone());
        Ok(manager)
    }

    async fn signer(&self) -> Result<AuthClient<Posting>, String> {
        self.signer
            .get_or_try_init(|| async {
                Ok(AuthClient::new(
                    Posting::new(tls::client()),
                    self.new_manager().await?,
                ))
            })
            .await
            .cloned()
    }

    /// The `Authorization` value for a request sent now, the token refreshed first if it is
    /// about to expire; `None` when there is no token to send (the server's 401 then says
    /// what is needed).
    pub(crate) async fn access_token(&self) -> Option<reqwest::header::HeaderValue> {
        let token = self.signer().await.ok()?.get_access_token().await.ok()?;
        self.warn_if_in_clear();
        reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).ok()
    }

    /// Before a session opens: the client that signs its requests. Stored tokens are read
    /// here (their client is configured for refreshing); a failure to reach the
    /// authorization server now is not fatal while the access token is still valid.
    pub(crate) async fn client(&self, http: Posting) -> Result<AuthClient<Posting>, String> {
        let mut signer = self.signer().await?;
        signer.http_client = http;
        let record = self.tokens.record().ok().flatten();
        if record.is_some() {
            self.warn_if_in_clear();
        }
        if let Some(record) = record
            && let Some(credentials) = &record.credentials
        {
            // A configured client ID wins: tokens of another client then cannot be refreshed
            // (rmcp refuses), and the fault asks for a login instead of a refresh failing.
            let client_id = self
                .config
                .client_id
                .clone()
                .unwrap_or_else(|| credentials.client_id.clone());
            if self.prepared_client().as_deref() != Some(client_id.as_str()) {
                let mut manager = signer.auth_manager.lock().await;
                // Another session may have set it up while this one waited for the lock.
                if self.prepared_client().as_deref() != Some(client_id.as_str()) {
                    self.prepare(&mut manager, &record, client_id).await;
                }
            }
        }
        Ok(signer)
    }

    /// Tokens sent to a plain-http server off loopback cross the network readable. They are
    /// sent (the server works as it would without Tether), and the operator is told once,
    /// with the server's host only (its URL may carry secrets).
    fn warn_if_in_clear(&self) {
        if !self.warned_in_clear.load(Ordering::Relaxed)
            && !self.warned_in_clear.swap(true, Ordering::Relaxed)
        {
            let url = url::Url::parse(&self.endpoint).ok();
            let host = url.as_ref().and_then(url::Url::host_str).unwrap_or("?");
            tracing::warn!(
                server = %self.server,
                "OAuth access tokens go to {host} over plain http, readable on the network: serve it over https"
            );
        }
    }

    fn prepared_client(&self) -> Option<String> {
        self.prepared_for
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_prepared_client(&self, client_id: Option<String>) {
        *self.prepared_for.lock().unwrap_or_else(|e| e.into_inner()) = client_id;
    }

    /// Sets `manager` up to refresh the stored tokens as `client_id`, with the authorization
    /// server's metadata discovered again and checked as a login checks it. Left not set up
    /// (tried again at the next session) when the metadata cannot be trusted now.
    async fn prepare(
        &self,
        manager: &mut AuthorizationManager,
        record: &Record,
        client_id: String,
    ) {
        let stored_issuer = record
            .credentials
            .as_ref()
            .and_then(|credentials| credentials.issuer.as_deref());
        let fit = |found: &AuthorizationMetadataResolution| {
            fit_for_refresh(&found.metadata, found.source.is_discovered(), stored_issuer)
        };
        let words = |error| self.words("reading the authorization server's metadata", &error);
        let mut resolution = manager.resolve_metadata().await.map_err(words);
        if matches!(&resolution, Ok(found) if fit(found).is_err())
            && let Some(challenge) = self.fetch_challenge().await
        {
            // The well-known documents did not lead there; the server's 401 may.
            resolution = manager
                .resolve_metadata_from_challenge(Some(&challenge))
                .await
                .map_err(words);
        }
        let metadata = match resolution.and_then(|found| fit(&found).map(|()| found.metadata)) {
            Ok(metadata) => metadata,
            Err(why) => {
                tracing::warn!(server = %self.server, "not setting up token refresh now: {why} (the stored token is used until it must be refreshed)");
                return;
            }
        };
        manager.set_metadata(metadata);
        match manager.initialize_from_store().await {
            Ok(true) => {
                // A registered client's secret is the record's; a configured client's, the config's.
                let registered = self.config.client_id.is_none();
                let secret = self
                    .config
                    .client_secret
                    .as_ref()
                    .map(|secret| secret.expose().to_string())
                    .or_else(|| record.client_secret.clone().filter(|_| registered));
                let mut client = OAuthClientConfig::new(client_id.clone(), self.endpoint.clone());
                client.client_secret = secret;
                client.application_type = None;
                match manager.configure_client(client) {
                    Ok(()) => self.set_prepared_client(Some(client_id)),
                    Err(error) => {
                        tracing::warn!(server = %self.server, "{}", self.words("configuring the client", &error))
                    }
                }
            }
            Ok(false) => {}
            Err(error) => tracing::warn!(
                server = %self.server,
                "{} (the stored token is used until it must be refreshed)",
                self.words("reading the stored tokens", &error)
            ),
        }
    }

    /// Whether a failed request may be sent again after new tokens: only then does the
    /// transport keep a copy of it.
    pub fn may_retry(&self) -> bool {
        self.config.grant == Grant::ClientCredentials || self.context.browser.is_some()
    }

    /// The fault text of a server that needs authorization.
    pub fn fault_words(&self) -> String {
        let login = format!("run `tether auth login {}`", self.server);
        match self.current_need() {
            Some(Need::LoginInProgress) => format!(
                "authorization required: complete the login opened in the browser, or {login}"
            ),
            Some(Need::RefreshRejected) => format!(
                "authorization required: the authorization server refused to refresh the token (the grant was revoked or expired); {login}"
            ),
            Some(Need::Failed(why)) => format!("authorization required ({why}); {login}"),
            Some(Need::Scope(why)) => format!("authorization required: {why}; {login}"),
            Some(Need::Login) | None => format!("authorization required: {login}"),
        }
    }

    /// A 401 that no refresh cured. Client credentials buy a new token at once; otherwise the
    /// gateway opens a login in the browser once per run, and the request fails.
    pub async fn on_unauthorized(self: &Arc<Self>, challenge: Option<&str>) -> Recovery {
        if self.config.grant == Grant::ClientCredentials {
            return match self.client_credentials(challenge, Vec::new()).await {
                Ok(_) => Recovery::Retry,
                Err(why) => {
                    self.set_need(Some(Need::Failed(why)));
                    Recovery::GiveUp
                }
            };
        }
        let rejected = self
            .tokens
            .record()
            .ok()
            .flatten()
            .is_some_and(|record| record.refresh_rejected);
        if self.current_need() != Some(Need::LoginInProgress) {
            self.set_need(Some(if rejected {
                Need::RefreshRejected
            } else {
                Need::Login
            }));
        }
        if let Some(browser) = self.context.browser.clone()
            && !self.auto_login_spent.swap(true, Ordering::AcqRel)
        {
            self.set_need(Some(Need::LoginInProgress));
            let this = self.clone();
            let challenge = challenge.map(str::to_string);
            // The login outlives the request: a person may take longer than a call waits.
            let login = tokio::spawn(async move {
                let show = |url: &str| {
                    tracing::warn!(server = %this.server, "server {:?} demands authorization: log in at {url}", this.server);
                };
                let outcome = this
                    .login(challenge, Vec::new(), Some(&browser), &show)
                    .await;
                if let Err(why) = &outcome {
                    tracing::warn!(server = %this.server, "login failed: {why}");
                }
                outcome.is_ok()
            });
            if let Ok(Ok(true)) = tokio::time::timeout(AUTO_LOGIN_PATIENCE, login).await {
                return Recovery::Retry;
            }
        }
        Recovery::GiveUp
    }

    /// A signed request was answered: a later 401 may open a login again.
    pub fn answered(&self) {
        if self.auto_login_spent.load(Ordering::Relaxed) {
            self.auto_login_spent.store(false, Ordering::Release);
        }
    }

    /// A 403 `insufficient_scope`: one step-up to the scopes held plus those named, unless
    /// they were granted already (then it is the server's word against the grant: no loop).
    pub async fn on_insufficient_scope(self: &Arc<Self>, challenge: &str) -> Recovery {
        let base = url::Url::parse(&self.endpoint).ok();
        let required: Vec<String> = base
            .map(|base| WWWAuthenticateParams::parse(challenge, &base))
            .and_then(|params| params.scope)
            .map(|scope| scope.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        let granted: Vec<String> = self
            .tokens
            .record()
            .ok()
            .flatten()
            .and_then(|record| record.credentials)
            .map(|credentials| credentials.granted_scopes)
            .unwrap_or_default();
        let missing: Vec<&String> = required.iter().filter(|s| !granted.contains(s)).collect();
        if missing.is_empty() {
            self.set_need(Some(Need::Scope(format!(
                "the server refuses the request for lack of scope {:?}, which was granted",
                required.join(" ")
            ))));
            return Recovery::GiveUp;
        }
        let mut scopes = granted.clone();
        for scope in self.config.scopes.iter().chain(&required) {
            if !scopes.contains(scope) {
                scopes.push(scope.clone());
            }
        }
        let outcome = match (self.config.grant, self.context.browser.clone()) {
            (Grant::ClientCredentials, _) => self
                .client_credentials(Some(challenge), scopes)
                .await
                .map(|_| ()),
            (Grant::AuthorizationCode, Some(browser)) => {
                let show = |url: &str| {
                    tracing::warn!(server = %self.server, "server {:?} demands more scopes: log in at {url}", self.server);
                };
                self.login(Some(challenge.to_string()), scopes, Some(&browser), &show)
                    .await
                    .map(|_| ())
            }
            (Grant::AuthorizationCode, None) => Err(format!(
                "the server demands scope {:?} for this request",
                missing
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            )),
        };
        match outcome {
            Ok(()) => Recovery::Retry,
            Err(why) => {
                self.set_need(Some(Need::Scope(why)));
                Recovery::GiveUp
            }
        }
    }

    /// Wording for an OAuth failure at `step`: never a secret, never a whole body.
    fn words(&self, step: &str, error: &AuthError) -> String {
        let mut text = error.to_string();
        let mut secrets: Vec<String> = Vec::new();
        if let Some(secret) = &self.config.client_secret {
            secrets.push(secret.expose().to_string());
        }
        if let Ok(Some(record)) = self.tokens.record() {
            secrets.extend(record.client_secret);
            if let Some(tokens) = record.credentials.and_then(|c| c.token_response) {
                secrets.push(tokens.access_token().secret().clone());
                if let Some(refresh) = tokens.refresh_token() {
                    secrets.push(refresh.secret().clone());
                }
            }
        }
        for secret in secrets.iter().filter(|s| s.len() >= 4) {
            text = text.replace(secret.as_str(), "<redacted>");
        }
        let text: String = text.chars().take(300).collect();
        format!("{step} failed for server {:?}: {text}", self.server)
    }

    /// Discovers the authorization server from `challenge` (or the server's well-known
    /// documents) into `manager`, refusing endpoints that are neither https nor loopback.
    /// Says whether the authorization server takes client ID metadata documents.
    async fn discover(
        &self,
        manager: &mut AuthorizationManager,
        challenge: Option<&str>,
    ) -> Result<bool, String> {
        let resolution = manager
            .resolve_metadata_from_challenge(challenge)
            .await
            .map_err(|error| self.words("discovering the authorization server", &error))?;
        if let Some(field) = insecure_endpoint(&resolution.metadata) {
            return Err(format!(
                "discovering the authorization server failed for server {:?}: its {field} is neither https nor on loopback; refusing to send credentials there",
                self.server
            ));
        }
        let takes_metadata_documents = resolution
            .metadata
            .additional_fields
            .get("client_id_metadata_document_supported")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false);
        manager.set_metadata(resolution.metadata);
        Ok(takes_metadata_documents)
    }

    /// An authorization code login (PKCE): the authorization URL goes to `browser`, if any
    /// (and to `show`, for a person to open by hand), the redirect comes back to a listener on
    /// loopback, and the tokens are stored. `scopes`: what to ask for (empty: what the server
    /// names). A login already running is waited for instead of starting another.
    pub async fn login(
        &self,
        challenge: Option<String>,
        scopes: Vec<String>,
        browser: Option<&Browser>,
        show: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<Granted, String> {
        let before = self.grants.load(Ordering::Acquire);
        let _one_at_a_time = self.login_lock.lock().await;
        // Concurrent requests met the same 401 or 403: one login, not one after another.
        if let Some(granted) = self.granted_meanwhile(before, &scopes) {
            return Ok(granted);
        }
        let outcome = self.login_now(challenge, scopes, browser, show).await;
        match &outcome {
            Ok(_) => {
                self.set_need(None);
                let _ = self.context.authorized.send(self.server.clone());
            }
            Err(why) => self.set_need(Some(Need::Failed(why.clone()))),
        }
        outcome
    }

    async fn login_now(
        &self,
        challenge: Option<String>,
        scopes: Vec<String>,
        browser: Option<&Browser>,
        show: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<Granted, String> {
        let redirect = login::Redirect::bind()
            .await
            .map_err(|error| format!("logging in to server {:?} failed: {error}", self.server))?;
        let mut manager = self.new_manager().await?;
        // No 401 at hand (`tether auth login` before any): ask the server for one, so
        // discovery starts where the server points.
        let challenge = match challenge {
            Some(challenge) => Some(challenge),
            None => self.fetch_challenge().await,
        };
        let takes_metadata_documents = self.discover(&mut manager, challenge.as_deref()).await?;
        let mut scopes = if scopes.is_empty() {
            self.config.scopes.clone()
        } else {
            scopes
        };
        if scopes.is_empty() {
            scopes = manager.select_scopes(None, &[]);
        }
        let mut request = AuthorizationRequest::new(redirect.uri())
            .with_client_name(CLIENT_NAME)
            .with_scopes(scopes.clone());
        if let Some(challenge) = &challenge {
            request = request.with_challenge(challenge.clone());
        }
        let mut registered_secret = None;
        if let Some(client_id) = &self.config.client_id {
            request = request.with_preregistered_client(client_id.clone());
            if let Some(secret) = &self.config.client_secret {
                request = request.with_client_secret(secret.expose().to_string());
            }
        } else if let Some(url) = &self.config.client_metadata_url
            && takes_metadata_documents
        {
            request = request.with_client_metadata_url(url.clone());
        } else {
            // Registered here rather than by rmcp, to keep the secret a registration may
            // return: refreshing needs it after a restart.
            let scope_refs: Vec<&str> = scopes.iter().map(String::as_str).collect();
            let registered = manager
                .register_client(CLIENT_NAME, &redirect.uri(), &scope_refs)
                .await
                .map_err(|error| self.words("registering the client", &error))?;
            request = request.with_preregistered_client(registered.client_id.clone());
            if let Some(secret) = registered.client_secret {
                request = request.with_client_secret(secret.clone());
                registered_secret = Some(secret);
            }
        }
        let session = AuthorizationSession::new(manager, request)
            .await
            .map_err(|(_, error)| self.words("starting the authorization", &error))?;
        let url = session.get_authorization_url().to_string();
        let state = url::Url::parse(&url)
            .ok()
            .and_then(|url| {
                url.query_pairs()
                    .find(|(key, _)| key == "state")
                    .map(|(_, value)| value.into_owned())
            })
            .ok_or_else(|| {
                format!(
                    "logging in to server {:?} failed: the authorization URL has no state",
                    self.server
                )
            })?;
        show(&url);
        if let Some(browser) = browser
            && let Err(error) = browser.open(&url)
        {
            tracing::warn!(server = %self.server, "cannot start the browser ({error}); open the URL by hand");
        }
        let callback = redirect
            .wait(&state, self.context.login_wait)
            .await
            .map_err(|error| format!("logging in to server {:?} failed: {error}", self.server))?;
        // The lock refreshes take (in this and every other process): a refresh running now
        // would otherwise write the older tokens back over the ones this login stores. Let go
        // before adopting: a session that adoption waits for may be refreshing.
        let no_refresh_meanwhile = self.refresh_lock().await?;
        session
            .handle_callback_url(&callback)
            .await
            .map_err(|error| self.words("exchanging the code for tokens", &error))?;
        if registered_secret.is_some() || self.config.client_secret.is_none() {
            self.tokens
                .update(|record| record.client_secret = registered_secret)
                .map_err(|error| self.words("storing the client", &error))?;
        }
        drop(no_refresh_meanwhile);
        self.adopt(session.auth_manager).await;
        Ok(self.granted())
    }

    /// Machine to machine: the configured client buys a token with `scopes` (empty: those
    /// configured).
    async fn client_credentials(
        &self,
        challenge: Option<&str>,
        scopes: Vec<String>,
    ) -> Result<Granted, String> {
        let before = self.grants.load(Ordering::Acquire);
        let _one_at_a_time = self.login_lock.lock().await;
        if let Some(granted) = self.granted_meanwhile(before, &scopes) {
            return Ok(granted);
        }
        let (Some(client_id), Some(secret)) = (&self.config.client_id, &self.config.client_secret)
        else {
            return Err(
                "the client credentials grant needs `client_id` and `client_secret`".into(),
            );
        };
        let mut manager = self.new_manager().await?;
        self.discover(&mut manager, challenge).await?;
        let resource = self.protected_resource(challenge).await;
        let scopes = if scopes.is_empty() {
            self.config.scopes.clone()
        } else {
            scopes
        };
        let config = ClientCredentialsConfig::ClientSecret {
            client_id: client_id.clone(),
            client_secret: secret.expose().to_string(),
            scopes,
            resource: Some(resource),
        };
        manager
            .validate_client_credentials_metadata(&config)
            .and_then(|()| manager.configure_client_credentials(&config))
            .map_err(|error| self.words("setting up the client credentials grant", &error))?;
        let no_refresh_meanwhile = self.refresh_lock().await?;
        manager
            .exchange_client_credentials(&config)
            .await
            .map_err(|error| self.words("the client credentials grant", &error))?;
        drop(no_refresh_meanwhile);
        self.adopt(manager).await;
        self.set_need(None);
        Ok(self.granted())
    }

    /// The lock a refresh of this server's tokens holds from reading them to storing new ones.
    async fn refresh_lock(&self) -> Result<Option<CredentialRefreshGuard>, String> {
        self.tokens
            .acquire_refresh_guard()
            .await
            .map_err(|error| self.words("waiting for a token refresh to finish", &error))
    }

    /// Puts a manager that just obtained tokens in place of the shared one. A signer that a
    /// session is making meanwhile is waited for and given the manager: were it made after
    /// this, with a manager that never read the tokens, it would be taken as set up and the
    /// server's tokens could not be refreshed.
    async fn adopt(&self, manager: AuthorizationManager) {
        let unused = fill_or_hand_back(&self.signer, manager, |manager| {
            AuthClient::new(Posting::new(tls::client()), manager)
        })
        .await;
        if let Some((signer, manager)) = unused {
            *signer.auth_manager.lock().await = manager;
        }
        let client_id = self
            .tokens
            .record()
            .ok()
            .flatten()
            .and_then(|record| record.credentials)
            .map(|credentials| credentials.client_id);
        self.set_prepared_client(client_id);
        self.grants.fetch_add(1, Ordering::AcqRel);
        self.warn_if_in_clear();
    }

    /// What was granted since `before` (a count of `grants`), if it holds every scope asked
    /// for (none asked: any grant will do).
    fn granted_meanwhile(&self, before: u64, scopes: &[String]) -> Option<Granted> {
        if self.grants.load(Ordering::Acquire) == before {
            return None;
        }
        let granted = self.granted();
        scopes
            .iter()
            .all(|scope| granted.scopes.contains(scope))
            .then_some(granted)
    }

    fn granted(&self) -> Granted {
        let status = self.status();
        Granted {
            scopes: status.scopes,
            expires_at: status.expires_at,
        }
    }

    /// The server's 401 challenge, asked for with an unauthenticated request.
    async fn fetch_challenge(&self) -> Option<String> {
        let answer = bounded_client()
            .post(&self.endpoint)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(r#"{"jsonrpc":"2.0","id":0,"method":"server/discover","params":{}}"#)
            .send()
            .await
            .ok()?;
        (answer.status() == reqwest::StatusCode::UNAUTHORIZED)
            .then(|| {
                answer
                    .headers()
                    .get("www-authenticate")?
                    .to_str()
                    .ok()
                    .map(str::to_string)
            })
            .flatten()
    }

    /// The resource to ask tokens for (RFC 8707): what the server's protected-resource
    /// metadata says, else its URL.
    async fn protected_resource(&self, challenge: Option<&str>) -> String {
        let Ok(base) = url::Url::parse(&self.endpoint) else {
            return self.endpoint.clone();
        };
        let mut candidates = Vec::new();
        if let Some(url) = challenge
            .map(|challenge| WWWAuthenticateParams::parse(challenge, &base))
            .and_then(|params| params.resource_metadata_url)
        {
            candidates.push(url);
        }
        let path = base.path().trim_end_matches('/');
        for suffix in [path, ""] {
            if let Ok(url) = base.join(&format!("/.well-known/oauth-protected-resource{suffix}")) {
                candidates.push(url);
            }
        }
        for url in candidates {
            let Ok(mut answer) = bounded_client().get(url).send().await else {
                continue;
            };
            if !answer.status().is_success() {
                continue;
            }
            // Read no further than a metadata document can be.
            let mut body = Vec::new();
            while let Ok(Some(chunk)) = answer.chunk().await {
                body.extend_from_slice(&chunk);
                if body.len() > 64 << 10 {
                    break;
                }
            }
            if body.len() > 64 << 10 {
                continue;
            }
            let resource = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|document| document.get("resource")?.as_str().map(str::to_string));
            // Only a resource that names this server (RFC 9728): a document elsewhere must not
            // have a token minted for another resource and sent here.
            if let Some(resource) = resource
                && names_endpoint(&resource, &base)
            {
                return resource;
            }
        }
        self.endpoint.clone()
    }

    /// What is known about the server's authorization (no secret).
    pub fn status(&self) -> AuthStatus {
        let record = self.tokens.record().ok().flatten();
        let credentials = record
            .as_ref()
            .and_then(|record| record.credentials.clone());
        let tokens = credentials.as_ref().and_then(|c| c.token_response.clone());
        let expires_at = credentials.as_ref().and_then(|c| {
            let received = c.token_received_at?;
            let lifetime = c.token_response.as_ref()?.expires_in()?;
            Some(received + lifetime.as_secs())
        });
        let problem = match self.current_need() {
            Some(_) => Some(self.fault_words()),
            None if record.as_ref().is_some_and(|r| r.refresh_rejected) => {
                self.set_need(Some(Need::RefreshRejected));
                Some(self.fault_words())
            }
            None => None,
        };
        AuthStatus {
            server: self.server.clone(),
            authorized: tokens.is_some(),
            scopes: credentials
                .as_ref()
                .map(|c| c.granted_scopes.clone())
                .unwrap_or_default(),
            expires_at,
            refreshable: tokens.as_ref().is_some_and(|t| t.refresh_token().is_some()),
            issuer: credentials.and_then(|c| c.issuer),
            problem,
        }
    }

    /// Forgets the server's tokens (logout, or the server left the config).
    pub fn forget(&self) -> Result<(), String> {
        self.set_prepared_client(None);
        self.tokens
            .remove()
            .map_err(|error| self.words("removing the tokens", &error))
    }
}

/// Whether `resource` identifies `endpoint`: the same origin, and a path that is the
/// endpoint's or a parent of it (a query carries no identity).
fn names_endpoint(resource: &str, endpoint: &url::Url) -> bool {
    let Ok(resource) = url::Url::parse(resource) else {
        return false;
    };
    if resource.origin() != endpoint.origin() {
        return false;
    }
    let (parent, path) = (resource.path(), endpoint.path());
    path == parent
        || (path.starts_with(parent)
            && (parent.ends_with('/') || path.as_bytes().get(parent.len()) == Some(&b'/')))
}

/// Whether discovered metadata may be used to refresh tokens issued by `stored_issuer`: its
/// endpoints https or loopback (as for a login), and, when the tokens name their issuer,
/// metadata that names one too. Endpoints guessed from the server's URL (nothing discovered,
/// as when a proxy answers 502 for a moment) would send the refresh token to the MCP server.
fn fit_for_refresh(
    metadata: &AuthorizationMetadata,
    discovered: bool,
    stored_issuer: Option<&str>,
) -> Result<(), String> {
    if let Some(field) = insecure_endpoint(metadata) {
        return Err(format!(
            "the authorization server's {field} is neither https nor on loopback"
        ));
    }
    if let Some(issuer) = stored_issuer
        && (!discovered || metadata.issuer.is_none())
    {
        return Err(format!(
            "the metadata of the authorization server that issued the tokens ({issuer}) was not found"
        ));
    }
    Ok(())
}

/// Fills `cell` with `make(value)`; if it is filled already, or by another task while this
/// waited for it, gives `value` back with what the cell holds, never dropping it.
async fn fill_or_hand_back<T, V>(
    cell: &OnceCell<T>,
    value: V,
    make: impl FnOnce(V) -> T,
) -> Option<(&T, V)> {
    let mut slot = Some(value);
    let taken = &mut slot;
    let filled = cell
        .get_or_init(|| async move { make(taken.take().expect("the value is taken once")) })
        .await;
    slot.map(|value| (filled, value))
}

/// A client for the few requests Tether makes outside rmcp (a challenge, a metadata
/// document): short deadlines, no redirects.
fn bounded_client() -> reqwest::Client {
    tls::client_builder()
        .timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default()
}

/// Seconds from now until `at`, for display.
pub fn expires_in(at: u64) -> i64 {
    at as i64 - now_secs() as i64
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorizer")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_is_taken_only_when_it_names_the_server() {
        let endpoint = url::Url::parse("https://mcp.example/team/mcp?x=1").unwrap();
        for (resource, names) in [
            ("https://mcp.example/team/mcp", true),
            ("https://mcp.example/team/mcp?y=2", true),
            ("https://mcp.example/team", true),
            ("https://mcp.example/team/", true),
            ("https://mcp.example/", true),
            ("https://mcp.example:443/team/mcp", true),
            ("https://mcp.example/te", false),
            ("https://mcp.example/team/mcp/more", false),
            ("https://api.bank.example/team/mcp", false),
            ("http://mcp.example/team/mcp", false),
            ("https://mcp.example:8443/team/mcp", false),
            ("not a url", false),
        ] {
            assert_eq!(names_endpoint(resource, &endpoint), names, "{resource}");
        }
    }

    #[test]
    fn tokens_are_refreshed_only_where_their_issuer_is_found_and_secure() {
        let mut found = AuthorizationMetadata::default();
        found.authorization_endpoint = "https://as.example/authorize".into();
        found.token_endpoint = "https://as.example/token".into();
        found.issuer = Some("https://as.example".into());
        let issuer = Some("https://as.example");
        assert_eq!(fit_for_refresh(&found, true, issuer), Ok(()));
        assert_eq!(fit_for_refresh(&found, true, None), Ok(()));
        // Endpoints guessed from the MCP server's URL: not where these tokens came from.
        let mut guessed = AuthorizationMetadata::default();
        guessed.authorization_endpoint = "https://mcp.example/authorize".into();
        guessed.token_endpoint = "https://mcp.example/token".into();
        let refused = fit_for_refresh(&guessed, false, issuer).unwrap_err();
        assert!(refused.contains("https://as.example"), "{refused}");
        // Tokens from a login that found no metadata either: the same guess serves.
        assert_eq!(fit_for_refresh(&guessed, false, None), Ok(()));
        // Discovered without an issuer, for tokens that name theirs.
        let mut anonymous = found.clone();
        anonymous.issuer = None;
        assert!(fit_for_refresh(&anonymous, true, issuer).is_err());
        let mut plain = found.clone();
        plain.token_endpoint = "http://as.example/token".into();
        let refused = fit_for_refresh(&plain, true, issuer).unwrap_err();
        assert!(refused.contains("token_endpoint"), "{refused}");
    }

    #[tokio::test]
    async fn a_value_meeting_a_cell_being_filled_is_handed_back_not_lost() {
        let cell = OnceCell::<&str>::new();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let (started, has_started) = tokio::sync::oneshot::channel::<()>();
        let filling = cell.get_or_init(|| async {
            let _ = started.send(());
            let _ = released.await;
            "made by a session"
        });
        let adopting = async {
            let _ = has_started.await;
            fill_or_hand_back(&cell, "just logged in", |value| value).await
        };
        let releasing = async {
            // The adopting side is parked on the cell by now: it polls before this.
            tokio::task::yield_now().await;
            let _ = release.send(());
        };
        let (made, unused, ()) = tokio::join!(filling, adopting, releasing);
        assert_eq!(*made, "made by a session");
        assert_eq!(unused, Some((&"made by a session", "just logged in")));

        let empty = OnceCell::<&str>::new();
        assert_eq!(
            fill_or_hand_back(&empty, "first", |value| value).await,
            None
        );
        assert_eq!(empty.get(), Some(&"first"));
    }

    #[test]
    fn only_https_or_loopback_endpoints_get_credentials() {
        for url in [
            "https://as.example/token",
            "http://127.0.0.1:9/token",
            "http://localhost/token",
            "http://[::1]:8/t",
        ] {
            assert!(secure_enough(url), "{url}");
        }
        for url in [
            "http://as.example/token",
            "http://10.0.0.1/t",
            "ftp://x/t",
            "not a url",
        ] {
            assert!(!secure_enough(url), "{url}");
        }
    }
}
