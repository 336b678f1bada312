//! TLS for Tether's HTTP clients, set up once per process.
//!
//! reqwest sets TLS up for every client it builds, and its verifier (the platform's, through
//! `rustls-platform-verifier`) reads and parses every root certificate of the system each time:
//! on Debian, about 150 files, 3 ms of CPU. Tether builds a client for each session it opens and
//! for the OAuth work of each server, so each reconnect spent 3 ms reading the same roots again
//! (rmcp's OAuth manager builds two clients of its own, once a server, which this cannot reach).
//! Here the verifier is made once and every client of Tether's shares it: the same TLS reqwest
//! would set up (rustls on aws-lc, or the process's own provider if it installed one; the
//! platform's verifier, which reads `SSL_CERT_FILE` and `SSL_CERT_DIR` when first made),
//! offering each client the HTTP versions it speaks.

use std::sync::{Arc, OnceLock};

use rustls::ClientConfig;
use rustls_platform_verifier::BuilderVerifierExt;

/// The shared set-up, without the HTTP versions; `None` where the platform's verifier cannot
/// be made (no root certificates), which reqwest would have refused too.
fn shared() -> Option<&'static ClientConfig> {
    static SHARED: OnceLock<Option<ClientConfig>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            // reqwest's choice: the process's provider if it installed one, else aws-lc.
            let provider = rustls::crypto::CryptoProvider::get_default()
                .cloned()
                .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
            let config = ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .ok()?
                .with_platform_verifier()
                .ok()?
                .with_no_client_auth();
            Some(config)
        })
        .as_ref()
}

/// The shared TLS for a client that speaks HTTP/1.1 only (`kept.rs`).
pub(crate) fn http1() -> Option<Arc<ClientConfig>> {
    static HTTP1: OnceLock<Option<Arc<ClientConfig>>> = OnceLock::new();
    HTTP1
        .get_or_init(|| Some(Arc::new(speaking(&[b"http/1.1"])?)))
        .clone()
}

/// A reqwest client builder with the shared TLS, offering HTTP/2 and HTTP/1.1 as reqwest does;
/// with reqwest's own set-up where the shared one cannot be made (its error then says why).
pub(crate) fn client_builder() -> reqwest::ClientBuilder {
    let builder = reqwest::Client::builder();
    match speaking(&[b"h2", b"http/1.1"]) {
        Some(tls) => builder.tls_backend_preconfigured(tls),
        None => builder,
    }
}

/// A reqwest client with the shared TLS and reqwest's defaults otherwise.
pub(crate) fn client() -> reqwest::Client {
    client_builder().build().unwrap_or_default()
}

/// The shared set-up, offering `protocols` (ALPN): the verifier is shared, not made again.
fn speaking(protocols: &[&[u8]]) -> Option<ClientConfig> {
    let mut config = shared()?.clone();
    config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
    Some(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_is_offered_the_http_versions_it_speaks() {
        let (Some(both), Some(http1)) = (speaking(&[b"h2", b"http/1.1"]), http1()) else {
            panic!("the platform's verifier could not be made");
        };
        assert_eq!(both.alpn_protocols, [b"h2".to_vec(), b"http/1.1".to_vec()]);
        assert_eq!(http1.alpn_protocols, [b"http/1.1".to_vec()]);
        // reqwest takes the set-up as its own (it refuses what it does not know at build).
        assert!(client_builder().build().is_ok());
    }
}
