//! The Streamable HTTP client that signs requests for a server that may use OAuth: rmcp's
//! `AuthClient` attaches the token (refreshing it first when it is about to expire, and once
//! more on a 401); a 401 it cannot cure and a 403 `insufficient_scope` go to the server's
//! [`Authorizer`], which may obtain new tokens, and then the request is sent once more.
//!
//! A server that has never been authorized (no tokens stored, none obtained in this run) is
//! sent to unsigned, as rmcp's signer sends a request it has no token for, but without it: a
//! signer reads the server's stored tokens on every request, and setting one up reads every
//! root certificate of the system twice (rmcp's OAuth clients). Every HTTP server without an
//! `Authorization` header may use OAuth, and most never do. The first 401 goes to the
//! authorizer as it would from the signer; from the moment the server has tokens, its sessions
//! sign their requests.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::auth::AuthClient;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sse_stream::{Error as SseError, Sse};

use super::post::Posting;
use crate::auth::{Authorizer, Recovery};

type Failed = StreamableHttpError<reqwest::Error>;

/// Sends through the plain client, or signed for a server with an [`Authorizer`] once it has
/// tokens.
#[derive(Clone)]
pub(crate) struct Signing {
    plain: Posting,
    authorizer: Option<Arc<Authorizer>>,
    /// This session's signer (its own HTTP client on the server's shared manager), once the
    /// server has one.
    signer: Arc<OnceLock<Arc<AuthClient<Posting>>>>,
}

impl Signing {
    pub fn plain(plain: Posting) -> Self {
        Self {
            plain,
            authorizer: None,
            signer: Arc::default(),
        }
    }

    /// Signed with `signer` if given, else unsigned until the server has tokens.
    pub fn with(
        plain: Posting,
        signer: Option<AuthClient<Posting>>,
        authorizer: Arc<Authorizer>,
    ) -> Self {
        let signing = Self {
            plain,
            authorizer: Some(authorizer),
            signer: Arc::default(),
        };
        if let Some(signer) = signer {
            let _ = signing.signer.set(Arc::new(signer));
        }
        signing
    }

    pub fn authorizer(&self) -> Option<&Arc<Authorizer>> {
        self.authorizer.as_ref()
    }

    /// The signer of this session, if the server has one: made on this session's client the
    /// first time it is needed after the server obtained tokens.
    fn signer(&self, authorizer: &Authorizer) -> Option<&Arc<AuthClient<Posting>>> {
        if let Some(signer) = self.signer.get() {
            return Some(signer);
        }
        let mut mine = authorizer.signer_if_made()?.clone();
        mine.http_client = self.plain.clone();
        Some(self.signer.get_or_init(|| Arc::new(mine)))
    }
}

/// `$method` called on the session's signer once the server has one, else on the plain
/// client, and awaited.
macro_rules! signed_or_plain {
    ($signing:expr, $authorizer:expr, $method:ident($($argument:expr),* $(,)?)) => {
        match $signing.signer($authorizer) {
            Some(signer) => signer.$method($($argument),*).await,
            None => $signing.plain.$method($($argument),*).await,
        }
    };
}

/// What the authorizer makes of a failure: whether to send again.
async fn recovery(authorizer: &Arc<Authorizer>, failed: &Failed) -> Recovery {
    match failed {
        StreamableHttpError::AuthRequired(challenge) => {
            authorizer
                .on_unauthorized(Some(&challenge.www_authenticate_header))
                .await
        }
        StreamableHttpError::InsufficientScope(challenge) => {
            authorizer
                .on_insufficient_scope(&challenge.www_authenticate_header)
                .await
        }
        _ => Recovery::GiveUp,
    }
}

/// `first`, then, if the authorizer obtained new tokens after its failure, what `again` makes
/// (a request not sent until then). Whatever is answered lets the authorizer open a login
/// again later.
async fn recovering<T, Again>(
    authorizer: &Arc<Authorizer>,
    first: impl Future<Output = Result<T, Failed>>,
    again: Option<impl FnOnce() -> Again>,
) -> Result<T, Failed>
where
    Again: Future<Output = Result<T, Failed>>,
{
    let mut outcome = first.await;
    // Boxed: made only after a failure, it would otherwise take room in every call's future.
    if let Err(failed) = &outcome
        && Box::pin(recovery(authorizer, failed)).await == Recovery::Retry
        && let Some(again) = again
    {
        outcome = again().await;
    }
    if outcome.is_ok() {
        authorizer.answered();
    }
    outcome
}

impl StreamableHttpClient for Signing {
    type Error = reqwest::Error;

    forms_without_limits!(Failed);

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Failed> {
        let Some(authorizer) = &self.authorizer else {
            return self
                .plain
                .post_message_with_response_limits(
                    uri,
                    message,
                    session_id,
                    auth_header,
                    custom_headers,
                    limits,
                )
                .await;
        };
        // Each send boxed as it is made (3.3 KB each), so that what holds them is small: the
        // two sends and the recovery inline made `recovering` 18.5 KB, copied whole into its
        // box on every call of every HTTP server without an `Authorization` header. Signed or
        // not when sent: a send again after new tokens came is signed.
        let send = |message, custom_headers| {
            let uri = uri.clone();
            let (session_id, auth_header) = (session_id.clone(), auth_header.clone());
            Box::pin(async move {
                signed_or_plain!(
                    self,
                    authorizer,
                    post_message_with_response_limits(
                        uri,
                        message,
                        session_id,
                        auth_header,
                        custom_headers,
                        limits
                    )
                )
            })
        };
        // A copy only where new tokens could come while the request waits.
        let again = authorizer.may_retry().then(|| {
            let (message, custom_headers) = (message.clone(), custom_headers.clone());
            move || send(message, custom_headers)
        });
        recovering(authorizer, send(message, custom_headers), again).await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Failed> {
        let Some(authorizer) = &self.authorizer else {
            return self
                .plain
                .delete_session(uri, session_id, auth_header, custom_headers)
                .await;
        };
        // Ending a session asks for no new tokens.
        signed_or_plain!(
            self,
            authorizer,
            delete_session(uri, session_id, auth_header, custom_headers)
        )
    }


    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Failed> {
        let Some(authorizer) = &self.authorizer else {
            return self
                .plain
                .get_stream_with_max_sse_event_size(
                    uri,
                    session_id,
                    last_event_id,
                    auth_header,
                    custom_headers,
                    max_sse_event_size,
                )
                .await;
        };
        let open = || {
            let (uri, session_id) = (uri.clone(), session_id.clone());
            let (last_event_id, auth_header) = (last_event_id.clone(), auth_header.clone());
            let custom_headers = custom_headers.clone();
            async move {
                signed_or_plain!(
                    self,
                    authorizer,
                    get_stream_with_max_sse_event_size(
                        uri,
                        session_id,
                        last_event_id,
                        auth_header,
                        custom_headers,
                        max_sse_event_size
                    )
                )
            }
        };
        recovering(authorizer, open(), Some(open)).await
    }
}
