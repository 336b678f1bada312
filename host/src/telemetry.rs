//! Traces of forwarded requests: the W3C trace context a request carries in `_meta`
//! (`traceparent`, `tracestate`, `baggage`; the MCP convention, SEP-414) and, with the `otel`
//! feature and an exporter installed ([`export`]), one span per forwarded request.
//!
//! The context travels upstream either way. Without a span it is the client's, passed on as it
//! came (what works without Tether works through it); with one, the upstream request becomes a
//! child of Tether's span, itself a child of the client's.

use std::sync::Arc;

use rmcp::model::MetaObject;

/// A request's trace context as `_meta` carries it, uninterpreted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TraceContext {
    traceparent: Option<String>,
    tracestate: Option<String>,
    baggage: Option<String>,
}

impl TraceContext {
    /// The keys `meta` has.
    pub(crate) fn from_meta(meta: &MetaObject) -> Self {
        Self {
            traceparent: meta.get_traceparent().map(str::to_owned),
            tracestate: meta.get_tracestate().map(str::to_owned),
            baggage: meta.get_baggage().map(str::to_owned),
        }
    }

    /// Writes the keys it has into `meta` (replacing theirs).
    pub(crate) fn write_to(&self, meta: &mut MetaObject) {
        if let Some(value) = &self.traceparent {
            meta.set_traceparent(value.clone());
        }
        if let Some(value) = &self.tracestate {
            meta.set_tracestate(value.clone());
        }
        if let Some(value) = &self.baggage {
            meta.set_baggage(value.clone());
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.traceparent.is_none() && self.tracestate.is_none() && self.baggage.is_none()
    }
}

/// One forwarded request as a trace sees it: the client's context and, when traces are
/// exported, the span that ends when the last clone is dropped.
pub(crate) struct RequestTrace {
    incoming: TraceContext,
    #[cfg(feature = "otel")]
    span: Option<otel::Span>,
}

impl RequestTrace {
    /// Starts the trace of a `method` request for `target` (a tool, prompt or resource, as the
    /// client names it) with the context the client sent in `meta`.
    #[cfg_attr(not(feature = "otel"), allow(unused_variables))]
    pub(crate) fn start(method: &str, target: &str, meta: &MetaObject) -> Arc<Self> {
        let incoming = TraceContext::from_meta(meta);
        Arc::new(Self {
            #[cfg(feature = "otel")]
            span: otel::Span::start(method, target, &incoming),
            incoming,
        })
    }

    /// Records an attribute of the request (`tether.server`, `tether.admission`, …).
    pub(crate) fn record(&self, key: &'static str, value: impl Into<Attribute>) {
        #[cfg(feature = "otel")]
        if let Some(span) = &self.span {
            span.record(key, value.into());
        }
        #[cfg(not(feature = "otel"))]
        let _ = (key, value.into());
    }

    /// Records how the request ended: `outcome` names it (`ok`, `tool_error`, `refused`, …);
    /// `error` describes a failure.
    pub(crate) fn outcome(&self, outcome: &str, error: Option<&str>) {
        self.record("tether.outcome", outcome);
        #[cfg(feature = "otel")]
        if let Some(span) = &self.span {
            span.fail(error);
        }
        #[cfg(not(feature = "otel"))]
        let _ = error;
    }

    /// The context to send upstream: this request's span when there is one, else the client's.
    pub(crate) fn outgoing(&self) -> TraceContext {
        #[cfg(feature = "otel")]
        if let Some(context) = self
            .span
            .as_ref()
            .and_then(|span| span.context(&self.incoming))
        {
            return context;
        }
        self.incoming.clone()
    }
}

/// What an attribute can hold.
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
pub(crate) enum Attribute {
    Text(String),
    Number(i64),
}

impl From<&str> for Attribute {
    fn from(value: &str) -> Self {
        Self::Text(value.to_owned())
    }
}

impl From<String> for Attribute {
    fn from(value: String) -> Self {
        Self::Text(value)
    }
}

impl From<u32> for Attribute {
    fn from(value: u32) -> Self {
        Self::Number(value.into())
    }
}

impl From<u64> for Attribute {
    fn from(value: u64) -> Self {
        Self::Number(i64::try_from(value).unwrap_or(i64::MAX))
    }
}

#[cfg(feature = "otel")]
pub use otel::{Exporting, export};

#[cfg(feature = "otel")]
mod otel {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
    use opentelemetry::{Context, KeyValue, global};
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use opentelemetry_sdk::trace::SdkTracerProvider;

    use super::{Attribute, TraceContext};

    /// Whether [`export`] installed a provider: until then no span is made at all.
    static EXPORTING: AtomicBool = AtomicBool::new(false);

    /// A span of a forwarded request (ended when dropped).
    pub(super) struct Span(Mutex<global::BoxedSpan>);

    impl Span {
        pub(super) fn start(method: &str, target: &str, parent: &TraceContext) -> Option<Self> {
            if !EXPORTING.load(Ordering::Relaxed) {
                return None;
            }
            let mut carrier = HashMap::new();
            if let Some(value) = &parent.traceparent {
                carrier.insert("traceparent".to_string(), value.clone());
            }
            if let Some(value) = &parent.tracestate {
                carrier.insert("tracestate".to_string(), value.clone());
            }
            // A malformed traceparent is no parent: the span starts a trace of its own.
            let parent = TraceContextPropagator::new().extract(&carrier);
            let tracer = global::tracer("tether");
            let span = tracer
                .span_builder(format!("{method} {target}"))
                .with_kind(SpanKind::Server)
                .with_attributes([
                    KeyValue::new("mcp.method.name", method.to_owned()),
                    KeyValue::new(
                        match method {
                            "tools/call" => "gen_ai.tool.name",
                            "prompts/get" => "gen_ai.prompt.name",
                            _ => "mcp.resource.uri",
                        },
                        target.to_owned(),
                    ),
                ])
                .start_with_context(&tracer, &parent);
            Some(Self(Mutex::new(span)))
        }

        pub(super) fn record(&self, key: &'static str, value: Attribute) {
            let value = match value {
                Attribute::Text(text) => KeyValue::new(key, text),
                Attribute::Number(number) => KeyValue::new(key, number),
            };
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .set_attribute(value);
        }

        pub(super) fn fail(&self, error: Option<&str>) {
            if let Some(error) = error {
                let mut span = self.0.lock().unwrap_or_else(|e| e.into_inner());
                span.set_status(Status::error(error.to_owned()));
            }
        }

        /// The span as the parent of the upstream request; the client's `baggage` goes along.
        pub(super) fn context(&self, incoming: &TraceContext) -> Option<TraceContext> {
            let span = self.0.lock().unwrap_or_else(|e| e.into_inner());
            let span_context = span.span_context().clone();
            if !span_context.is_valid() {
                return None;
            }
            let mut carrier = HashMap::new();
            TraceContextPropagator::new().inject_context(
                &Context::new().with_remote_span_context(span_context),
                &mut carrier,
            );
            Some(TraceContext {
                traceparent: carrier.remove("traceparent"),
                tracestate: carrier.remove("tracestate").filter(|s| !s.is_empty()),
                baggage: incoming.baggage.clone(),
            })
        }
    }

    /// Exporting spans; [`Exporting::shutdown`] sends what is left.
    pub struct Exporting {
        provider: SdkTracerProvider,
    }

    impl Exporting {
        /// Stops making spans and sends those not yet sent (blocks: call it off the runtime's
        /// worker threads, e.g. with `spawn_blocking`).
        pub fn shutdown(self) {
            EXPORTING.store(false, Ordering::Relaxed);
            if let Err(error) = self.provider.shutdown() {
                tracing::warn!("sending the last spans failed: {error}");
            }
        }
    }

    /// Exports a span per forwarded request over OTLP/HTTP (protobuf) to `endpoint` (the
    /// traces URL, e.g. `http://collector:4318/v1/traces`), or where the standard variables say
    /// (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_ENDPOINT`, their headers and
    /// timeouts; `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_BSP_*`).
    pub fn export(endpoint: Option<&str>) -> Result<Exporting, String> {
        use opentelemetry_otlp::WithExportConfig;
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
        if let Some(endpoint) = endpoint {
            exporter = exporter.with_endpoint(endpoint);
        }
        let exporter = exporter
            .build()
            .map_err(|e| format!("cannot export traces: {e}"))?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(
                std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "tether".to_owned()),
            )
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        global::set_tracer_provider(provider.clone());
        EXPORTING.store(true, Ordering::Relaxed);
        Ok(Exporting { provider })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clients_context_goes_upstream_as_it_came_when_no_span_is_made() {
        let mut meta = MetaObject::new();
        meta.set_traceparent("00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01");
        meta.set_baggage("user=alice");
        let trace = RequestTrace::start("tools/call", "echo", &meta);
        let mut upstream = MetaObject::new();
        trace.outgoing().write_to(&mut upstream);
        assert_eq!(upstream, meta);
        assert!(TraceContext::from_meta(&MetaObject::new()).is_empty());
    }
}
