//! The Streamable HTTP client that signs requests for a server that uses OAuth: rmcp's
//! `AuthClient` attaches the token (refreshing it first when it is about to expire, and once
//! more on a 401); a 401 it cannot cure and a 403 `insufficient_scope` go to the server's
//! [`Authorizer`], which may obtain new tokens, and then the request is sent once more.

use std::collections::HashMap;
use std::sync::Arc;

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

/// Sends through the plain client, or signed for a server with an [`Authorizer`].
#[derive(Clone)]
pub(crate) struct Signing {
    plain: Posting,
    oauth: Option<(Arc<AuthClient<Posting>>, Arc<Authorizer>)>,
}

impl Signing {
    pub fn plain(plain: Posting) -> Self {
        Self { plain, oauth: None }
    }

    pub fn signed(plain: Posting, signer: AuthClient<Posting>, authorizer: Arc<Authorizer>) -> Self {
        Self {
            plain,
            oauth: Some((Arc::new(signer), authorizer)),
        }
    }

    pub fn authorizer(&self) -> Option<&Arc<Authorizer>> {
        self.oauth.as_ref().map(|(_, authorizer)| authorizer)
    }
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

/// `first`, then, if the authorizer obtained new tokens after its failure, `again` (a request
/// not sent until then). Whatever is answered lets the authorizer open a login again later.
async fn recovering<T>(
    authorizer: &Arc<Authorizer>,
    first: impl Future<Output = Result<T, Failed>>,
    again: Option<impl Future<Output = Result<T, Failed>>>,
) -> Result<T, Failed> {
    let mut outcome = first.await;
    // Boxed: made only after a failure, it would otherwise take room in every call's future.
    if let Err(failed) = &outcome
        && Box::pin(recovery(authorizer, failed)).await == Recovery::Retry
        && let Some(again) = again
    {
        outcome = again.await;
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
        let Some((signer, authorizer)) = &self.oauth else {
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
        // box on every call of every HTTP server without an `Authorization` header.
        let send = |message, custom_headers| {
            Box::pin(signer.post_message_with_response_limits(
                uri.clone(),
                message,
                session_id.clone(),
                auth_header.clone(),
                custom_headers,
                limits,
            ))
        };
        // A copy only where new tokens could come while the request waits.
        let again = authorizer
            .may_retry()
            .then(|| send(message.clone(), custom_headers.clone()));
        recovering(authorizer, send(message, custom_headers), again).await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Failed> {
        match &self.oauth {
            None => {
                self.plain
                    .delete_session(uri, session_id, auth_header, custom_headers)
                    .await
            }
            // Ending a session asks for no new tokens.
            Some((signer, _)) => {
                signer
                    .delete_session(uri, session_id, auth_header, custom_headers)
                    .await
            }
        }
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
        let Some((signer, authorizer)) = &self.oauth else {
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
            signer.get_stream_with_max_sse_event_size(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                auth_header.clone(),
                custom_headers.clone(),
                max_sse_event_size,
            )
        };
        recovering(authorizer, open(), Some(open())).await
    }
}
