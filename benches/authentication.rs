//! What deciding a bearer token costs, side by side in one run: a token of a JWT issuer of
//! `--authentication-config` decided on the node (RS256 and ES256, claims mapped by name or by
//! CEL expressions with claim and user rules), the same token remembered from a decision made
//! within the last 10 s, and cold (from a fresh configuration until its first token is
//! accepted, the issuer's discovery document and keys fetched over TLS on loopback), against
//! today's path for a token the cache has seen, a cached TokenReview answer.
//! Run with `cargo bench --bench authentication`; about a minute once built.

use std::hint::black_box;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair, RsaKeyPair};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::json;
use tokio::runtime::Runtime;

use kubelet_auth_proxy::apiserver::{ApiServerClient, ApiServerMetrics, ApiServerSettings};
use kubelet_auth_proxy::authn::metrics::AuthnMetrics;
use kubelet_auth_proxy::authn::structured::validation::Context;
use kubelet_auth_proxy::authn::structured::{
    JwtOutcome, StructuredAuthentication, StructuredSettings,
};
use kubelet_auth_proxy::authn::token::{TokenOutcome, TokenReviewAuthenticator};

mod support;

/// Short measurements keep the run to about a minute on a small shared machine.
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The issuer's keys: the repository's RSA test key and a P-256 key made here.
struct Signers {
    rsa: RsaKeyPair,
    ec: EcdsaKeyPair,
}

impl Signers {
    fn new() -> Signers {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/jwt-issuer-rsa-key.pem"
        );
        let pem = std::fs::read(path).expect("the RSA test key");
        let der = PrivatePkcs8KeyDer::from_pem_slice(&pem).expect("a PKCS#8 key");
        let rng = SystemRandom::new();
        let ec = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("a P-256 key");
        Signers {
            rsa: RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).expect("an RSA key"),
            ec: EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, ec.as_ref(), &rng)
                .expect("a P-256 key"),
        }
    }

    fn jwks(&self) -> String {
        let rsa = ring::rsa::PublicKeyComponents::<Vec<u8>>::from(self.rsa.public());
        let point = self.ec.public_key().as_ref();
        json!({"keys": [
            {"kty": "RSA", "kid": "rsa", "use": "sig", "n": b64(&rsa.n), "e": b64(&rsa.e)},
            {"kty": "EC", "crv": "P-256", "kid": "ec", "use": "sig",
             "x": b64(&point[1..33]), "y": b64(&point[33..])},
        ]})
        .to_string()
    }

    /// A token of `issuer` signed RS256 (`rsa`) or ES256, valid for an hour.
    fn token(&self, issuer: &str, rsa: bool) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        let (alg, kid) = if rsa {
            ("RS256", "rsa")
        } else {
            ("ES256", "ec")
        };
        let header = json!({"alg": alg, "kid": kid, "typ": "JWT"});
        let claims = json!({
            "iss": issuer, "aud": "kubelet", "sub": "user-1", "email": "dev@example.com",
            "email_verified": true, "groups": ["dev", "oncall"], "iat": now, "nbf": now,
            "exp": now + 3600, "jti": "7f9c2e", "repository": "web", "run": 42,
            "protected": true,
        });
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let rng = SystemRandom::new();
        let signature = if rsa {
            let mut signature = vec![0; self.rsa.public().modulus_len()];
            self.rsa
                .sign(
                    &ring::signature::RSA_PKCS1_SHA256,
                    &rng,
                    input.as_bytes(),
                    &mut signature,
                )
                .expect("an RSA signature");
            signature
        } else {
            self.ec
                .sign(&rng, input.as_bytes())
                .expect("an ECDSA signature")
                .as_ref()
                .to_vec()
        };
        format!("{input}.{}", b64(&signature))
    }
}

/// An HTTPS issuer on loopback serving its discovery document and `jwks`, counting key fetches;
/// its CA as PEM.
async fn issuer(jwks: String, fetches: Arc<AtomicUsize>) -> (String, String) {
    let ca_key = rcgen::KeyPair::generate().expect("a CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).expect("a CA");
    let key = rcgen::KeyPair::generate().expect("a server key");
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .expect("server params")
        .signed_by(&key, &ca)
        .expect("a server certificate");
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
    .expect("a server configuration");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr: SocketAddr = listener.local_addr().expect("a bound address");
    let url = format!("https://{addr}");
    let discovery = json!({"issuer": url, "jwks_uri": format!("{url}/keys")}).to_string();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, discovery, jwks) = (acceptor.clone(), discovery.clone(), jwks.clone());
            let fetches = Arc::clone(&fetches);
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let body = if request.uri().path() == "/keys" {
                        fetches.fetch_add(1, Ordering::Relaxed);
                        jwks.clone()
                    } else {
                        discovery.clone()
                    };
                    async move {
                        http::Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from(body)))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (url, ca.pem())
}

/// A file with one authenticator for `url`, its claims mapped by name or by expressions.
fn authentication_config(
    dir: &std::path::Path,
    name: &str,
    url: &str,
    ca: &str,
    cel: bool,
) -> PathBuf {
    let mappings = if cel {
        "  claimValidationRules:\n  - expression: claims.protected == true\n    message: protected only\n\
         \x20 claimMappings:\n    username: {expression: \"'ci:' + claims.repository\"}\n\
         \x20   groups: {expression: \"claims.groups.map(g, 'team:' + g)\"}\n\
         \x20   uid: {expression: claims.sub}\n\
         \x20   extra: [{key: example.com/run, valueExpression: 'string(int(claims.run))'}]\n\
         \x20 userValidationRules:\n  - expression: \"!user.username.startsWith('system:')\"\n    message: no system users\n"
    } else {
        "  claimMappings:\n    username: {claim: email, prefix: ''}\n    groups: {claim: groups, prefix: 'oidc:'}\n\
         \x20   uid: {claim: sub}\n"
    };
    let ca: String = ca.lines().map(|line| format!("      {line}\n")).collect();
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\njwt:\n\
             - issuer:\n    url: {url}\n    audiences: [kubelet]\n    certificateAuthority: |\n{ca}{mappings}"
        ),
    )
    .expect("the configuration file");
    path
}

/// Starts the authenticators of `path` and waits until `token` is accepted.
async fn started(path: &std::path::Path, token: &str) -> Arc<StructuredAuthentication> {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = AuthnMetrics::register(&mut registry);
    let settings = StructuredSettings::load(path.to_owned(), Context::default())
        .expect("the configuration validates");
    let structured = StructuredAuthentication::start(
        settings,
        metrics.issuer_keys.clone(),
        metrics.structured.clone(),
    )
    .expect("the authenticators start");
    loop {
        match structured.authenticate(token).await {
            JwtOutcome::User(_) => return structured,
            JwtOutcome::Refused(reason) if reason.contains("not initialized") => {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            other => panic!("the bench token is refused: {other:?}"),
        }
    }
}

fn bearer_tokens(c: &mut Criterion) {
    let runtime = Runtime::new().expect("a runtime");
    let dir = std::env::temp_dir().join(format!("kap-bench-authn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let signers = Signers::new();
    let fetches = Arc::new(AtomicUsize::new(0));
    let (url, ca) = runtime.block_on(issuer(signers.jwks(), Arc::clone(&fetches)));
    let (rsa, ec) = (signers.token(&url, true), signers.token(&url, false));
    let claims_file = authentication_config(&dir, "claims", &url, &ca, false);
    let cel_file = authentication_config(&dir, "cel", &url, &ca, true);

    let mut group = c.benchmark_group("bearer_token");
    // Today's path for a token seen before: the TokenReview cache's answer.
    let reviews = Arc::new(AtomicUsize::new(0));
    let addr = runtime.block_on(support::answering_api_server(
        Arc::clone(&reviews),
        r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{},"status":{"authenticated":true,"user":{"username":"dev@example.com","uid":"user-1","groups":["oidc:dev","oidc:oncall"]}}}"#,
    ));
    let reviewer = runtime.block_on(async {
        let settings = ApiServerSettings::read(
            Some(&support::kubeconfig(&dir, addr)),
            Duration::from_secs(5),
        )
        .expect("the kubeconfig loads");
        let client = ApiServerClient::new(settings, 16, Arc::new(ApiServerMetrics::default()));
        let mut registry = prometheus_client::registry::Registry::default();
        TokenReviewAuthenticator::new(
            client,
            Vec::new(),
            Duration::from_secs(120),
            &AuthnMetrics::register(&mut registry),
        )
        .expect("system randomness")
    });
    let source = "10.0.0.1".parse().expect("an address");
    let warm = runtime.block_on(reviewer.authenticate(&rsa, source));
    assert!(matches!(warm, TokenOutcome::User(_)), "{warm:?}");
    group.bench_function("token_review_cached", |b| {
        b.to_async(&runtime)
            .iter(|| async { black_box(reviewer.authenticate(black_box(&rsa), source).await) });
    });
    assert_eq!(
        reviews.load(Ordering::Relaxed),
        1,
        "one review, then the cache"
    );

    for (name, file, token) in [
        ("jwt_rs256_claims", &claims_file, &rsa),
        ("jwt_es256_claims", &claims_file, &ec),
        ("jwt_rs256_cel", &cel_file, &rsa),
        ("jwt_es256_cel", &cel_file, &ec),
    ] {
        let structured = runtime.block_on(started(file, token));
        group.bench_function(name, |b| {
            b.to_async(&runtime).iter(|| async {
                match structured.decide(black_box(token)).await {
                    JwtOutcome::User(user) => black_box(user),
                    other => panic!("{name}: {other:?}"),
                }
            });
        });
    }
    // The same token again within 10 s: the user remembered, as kube-apiserver remembers it.
    let structured = runtime.block_on(started(&cel_file, &rsa));
    group.bench_function("jwt_remembered", |b| {
        b.to_async(&runtime).iter(|| async {
            match structured.authenticate(black_box(&rsa)).await {
                JwtOutcome::User(user) => black_box(user),
                other => panic!("jwt_remembered: {other:?}"),
            }
        });
    });
    // Cold: a configuration put in force and its first token accepted, the issuer's discovery
    // document and keys fetched over a new TLS connection.
    group.bench_function("jwt_rs256_cold_keys", |b| {
        b.to_async(&runtime).iter_custom(|iterations| {
            let (file, token) = (&claims_file, &rsa);
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    let began = Instant::now();
                    let structured = started(file, token).await;
                    total += began.elapsed();
                    drop(structured);
                }
                total
            }
        });
    });
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group! {
    name = benches;
    config = config();
    targets = bearer_tokens
}
criterion_main!(benches);
