//! The agent's side of a line transport may hand a client's tool calls to a [`DirectCalls`]
//! instead of rmcp's service loop (`gateway/direct.rs` serves them, and says why); the answer
//! is written through [`Answers`], the very write path of the transport's own `send`.

use std::sync::Arc;

use futures::future::BoxFuture;
use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequest, ClientNotification, ClientRequest, JsonRpcMessage, JsonRpcRequest, RequestId,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};

/// Takes tool calls off the service loop.
pub trait DirectCalls: Send + Sync {
    /// Takes the tool call `id` (its answer goes to `answers`), or gives it back when it cannot
    /// take it (yet): the service loop then serves it.
    fn call(
        &self,
        id: RequestId,
        call: CallToolRequest,
        answers: &Answers,
    ) -> Option<(RequestId, CallToolRequest)>;
    /// The client cancelled request `id` (`notifications/cancelled`).
    fn cancelled(&self, id: &RequestId);
    /// The session ended: calls still running are cancelled.
    fn closed(&self);
    /// The client's input ended (it may still read): calls still running go on for a while,
    /// as rmcp's loop gives its handlers (see [`Self::drained`]).
    fn input_ended(&self);
    /// Once every call running has written its answer, or the time rmcp's loop gives its
    /// handlers to answer has passed (5 s from the input's end, else 2 s from now, as rmcp
    /// drains its loop when its input ends or it is cancelled): then the rest are cancelled.
    fn drained(&self) -> BoxFuture<'static, ()>;
}

/// What the client is answered with.
// Made once per answer and moved into its write: a box would cost every typed answer an
// allocation to save a few hundred bytes of a move.
#[allow(clippy::large_enum_variant)]
pub enum Answer {
    Message(TxJsonRpcMessage<RoleServer>),
    /// The answer to tool call `id` whose result came as the server's bytes ([`super::raw`]),
    /// with `"resultType":"complete"` added for a 2026-07-28 client (`complete`).
    Raw {
        id: RequestId,
        result: super::raw::RawBytes,
        complete: bool,
    },
}

/// Writes one answer to the client.
pub type Answers = Arc<dyn Fn(Answer) -> BoxFuture<'static, std::io::Result<()>> + Send + Sync>;

/// A transport's direct calls and how their answers are written (made by
/// [`super::Lines::with_direct`]).
pub struct Direct {
    pub(super) calls: Arc<dyn DirectCalls>,
    pub(super) answers: Answers,
}

/// Hands a tool call to `direct`, and tells it of cancellations; what the service loop still
/// gets (cancellations too: rmcp ignores one for a request it never saw).
pub(super) fn divert(
    message: RxJsonRpcMessage<RoleServer>,
    direct: &Direct,
) -> Option<RxJsonRpcMessage<RoleServer>> {
    match message {
        JsonRpcMessage::Request(JsonRpcRequest {
            id,
            request: ClientRequest::CallToolRequest(call),
            ..
        }) => direct
            .calls
            .call(id, call, &direct.answers)
            .map(|(id, call)| {
                JsonRpcMessage::Request(JsonRpcRequest::new(
                    id,
                    ClientRequest::CallToolRequest(call),
                ))
            }),
        JsonRpcMessage::Notification(notification) => {
            if let ClientNotification::CancelledNotification(cancelled) =
                &notification.notification
                && let Some(id) = &cancelled.params.request_id
            {
                direct.calls.cancelled(id);
            }
            Some(JsonRpcMessage::Notification(notification))
        }
        other => Some(other),
    }
}
