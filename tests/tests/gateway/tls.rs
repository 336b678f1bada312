//! HTTPS upstreams: `tether serve` checks an upstream's certificate with rustls against the
//! platform's roots, which `SSL_CERT_FILE` extends with a private CA as for any program on the
//! machine. An upstream whose certificate is self-signed, expired or names another host is
//! refused, and its last fault says which.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, IsCa, Issuer, KeyPair, date_time_ymd,
};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, pki_types::PrivateKeyDer};

use super::*;

/// A certificate and its key.
struct Leaf {
    cert: Certificate,
    key: KeyPair,
}

fn params(names: &[&str]) -> CertificateParams {
    CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        .expect("valid names")
}

fn private_ca() -> (Certificate, Issuer<'static, KeyPair>) {
    let mut params = params(&[]);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "tether test CA");
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert, Issuer::new(params, key))
}

fn signed(params: CertificateParams, issuer: &Issuer<'static, KeyPair>) -> Leaf {
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    Leaf { cert, key }
}

/// Terminates TLS with `leaf` on a loopback port and relays the bytes to `backend` (the fixture
/// serving plain HTTP): a real HTTPS endpoint in front of a real MCP server. Counts the
/// handshakes it completed.
async fn tls_front(leaf: Leaf, backend: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.cert.der().clone()],
            PrivateKeyDer::Pkcs8(leaf.key.serialize_der().into()),
        )
        .expect("a usable certificate");
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let counted = handshakes.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let counted = counted.clone();
            tokio::spawn(async move {
                // A refused handshake ends here: that is the client saying no.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                if let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                }
            });
        }
    });
    (addr, handshakes)
}

/// The servers `tether status --json` reports: (name, state, last fault).
async fn server_rows(state_file: &Path) -> Vec<(String, String, String)> {
    let (_, stdout, _) = status(state_file, &["--json"]).await;
    let status: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_default();
    status["servers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|row| {
            (
                row["name"].as_str().unwrap_or_default().to_string(),
                row["state"].as_str().unwrap_or_default().to_string(),
                row["last_fault"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstreams_are_checked_against_the_roots_and_bad_certificates_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir(dir.path().join("fixture"));
    std::fs::create_dir_all(&state.0).unwrap();
    let fixture = HttpFixture::start("http", &state, "127.0.0.1:0", &[]).await;

    let (ca, issuer) = private_ca();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let here = ["localhost", "127.0.0.1"];
    let trusted = signed(params(&here), &issuer);
    let misnamed = signed(params(&["elsewhere.example"]), &issuer);
    let mut old = params(&here);
    old.not_before = date_time_ymd(2020, 1, 1);
    old.not_after = date_time_ymd(2021, 1, 1);
    let expired = signed(old, &issuer);
    let self_key = KeyPair::generate().unwrap();
    let self_signed = Leaf {
        cert: params(&here).self_signed(&self_key).unwrap(),
        key: self_key,
    };

    let mut servers = serde_json::Map::new();
    let mut trusted_handshakes = None;
    for (name, leaf) in [
        ("trusted", trusted),
        ("misnamed", misnamed),
        ("expired", expired),
        ("selfsigned", self_signed),
    ] {
        let (front, handshakes) = tls_front(leaf, fixture.addr).await;
        if name == "trusted" {
            trusted_handshakes = Some(handshakes);
        }
        servers.insert(
            name.to_string(),
            json!({
                "url": format!("https://127.0.0.1:{}/mcp", front.port()),
                "type": "http",
                "keep_connections": true,
            }),
        );
    }
    let config = dir.path().join("servers.json");
    std::fs::write(&config, json!({ "mcpServers": servers }).to_string()).unwrap();

    let mut command = serve_command(dir.path(), &config, &[]);
    // The private CA is trusted the way any program on the machine is told of one.
    command
        .env("SSL_CERT_FILE", &ca_file)
        .env_remove("SSL_CERT_DIR");
    command.stderr(Stdio::from(
        std::fs::File::create(dir.path().join("stderr")).unwrap(),
    ));
    let mut tether = command.spawn().expect("tether serve starts");
    let stdin = tether.stdin.take().unwrap();
    let stdout = tether.stdout.take().unwrap();
    let client = Agent::default()
        .serve((stdout, stdin))
        .await
        .expect("the agent's handshake with tether");

    // Over TLS end to end: the trusted upstream's tools are listed and answer.
    wait_for_tools(&client, "the trusted upstream's tools are listed", |t| {
        t.contains(&"trusted__echo".to_string())
    })
    .await;
    assert_eq!(
        text(&call(&client, "trusted__echo", json!({"text": "over tls"})).await),
        "over tls"
    );
    // Tool calls keep their TLS connections: no handshake a call (only Linux keeps them).
    #[cfg(target_os = "linux")]
    {
        let handshakes = trusted_handshakes.expect("the trusted front");
        let before = handshakes.load(Ordering::SeqCst);
        for _ in 0..10 {
            let answer = call(&client, "trusted__echo", json!({"text": "again"})).await;
            assert_eq!(text(&answer), "again");
        }
        let made = handshakes.load(Ordering::SeqCst) - before;
        assert!(made < 5, "10 calls made {made} TLS handshakes");
    }

    // The others are refused, each fault naming what is wrong with the certificate.
    let state_file = dir.path().join("state.json");
    let expected = [
        ("misnamed", "not valid for name"),
        ("expired", "expired"),
        ("selfsigned", "unknownissuer"),
    ];
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let rows = server_rows(&state_file).await;
        let refused = expected.iter().all(|(name, why)| {
            rows.iter()
                .any(|(n, _, fault)| n == name && fault.to_lowercase().contains(why))
        });
        if refused {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the bad certificates' faults do not say why: {rows:#?}\n{}",
            std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let names = tool_names(&client).await;
    assert!(
        names.iter().all(|n| n.starts_with("trusted__")),
        "only the trusted upstream's tools are shown: {names:?}"
    );

    drop(client);
    assert!(terminate(tether).await.success());
    fixture.kill().await;
}
