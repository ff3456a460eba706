//! The issuer keys against a stand-in issuer served over real HTTPS on loopback, with
//! certificates made here; and the parts without I/O: the key set as go-jose reads it, the key
//! chosen for a token, redirects resolved.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, ECDSA_P384_SHA384_FIXED_SIGNING, EcdsaKeyPair,
    EcdsaSigningAlgorithm, KeyPair, RSA_PKCS1_SHA256, RSA_PKCS1_SHA512, RSA_PSS_SHA256,
    RsaEncoding, RsaKeyPair,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::RwLock;

use super::fetch::{MAX_DOCUMENT_BYTES, resolve};
use super::jwks::{self, Choice};
use super::metrics::hash_label;
use super::*;
use crate::test_data::text;

/// A 2048-bit RSA private key (PKCS#8 PEM) made once with `openssl genpkey` for these tests
/// only, under `tests/data/`: a JWT issuer's signing key, which `ring` cannot generate.
const JWT_ISSUER_RSA_KEY: &str = "jwt-issuer-rsa-key.pem";
/// How long a loopback exchange may take: a bug fails the test, it never hangs it.
const WAIT: Duration = Duration::from_secs(10);
/// Longer than any test runs: the waits that must not end.
const NEVER: Duration = Duration::from_secs(3600);
const DISCOVERY: &str = "/.well-known/openid-configuration";
const JWKS: &str = "/jwks";
/// What the tokens here sign: only the signature is checked.
const INPUT: &[u8] = b"eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJ0ZXN0In0";

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// An answer of the stand-in.
#[derive(Clone)]
struct Reply {
    status: u16,
    location: Option<String>,
    body: Bytes,
}

impl Reply {
    fn ok(body: impl Into<Bytes>) -> Reply {
        Reply {
            status: 200,
            location: None,
            body: body.into(),
        }
    }

    fn status(status: u16) -> Reply {
        Reply {
            status,
            location: None,
            body: Bytes::from_static(b"no"),
        }
    }

    fn redirect(status: u16, to: &str) -> Reply {
        Reply {
            status,
            location: Some(to.to_owned()),
            body: Bytes::new(),
        }
    }
}

/// A JWT issuer on loopback: answers each path (with its query) as told, counts the requests
/// per path, and holds key set answers while the test holds `hold` for writing.
struct StandIn {
    addr: SocketAddr,
    /// The PEM of the CA that signed its certificate.
    ca: String,
    routes: Arc<Mutex<HashMap<String, Reply>>>,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    hold: Arc<RwLock<()>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A fresh CA (as PEM) and a server configuration with a certificate it signed for 127.0.0.1.
fn issuer_tls() -> (Arc<rustls::ServerConfig>, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.der().clone()], key)
    .unwrap();
    (Arc::new(server), ca.pem())
}

impl StandIn {
    async fn start() -> StandIn {
        let (tls, ca) = issuer_tls();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let routes: Arc<Mutex<HashMap<String, Reply>>> = Arc::default();
        let hits: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let hold: Arc<RwLock<()>> = Arc::default();
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let server = tokio::spawn({
            let (routes, hits, hold) = (routes.clone(), hits.clone(), hold.clone());
            async move {
                while let Ok((tcp, _)) = listener.accept().await {
                    let acceptor = acceptor.clone();
                    let (routes, hits, hold) = (routes.clone(), hits.clone(), hold.clone());
                    tokio::spawn(async move {
                        // A client that does not trust the CA ends here.
                        let Ok(tls) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let service = hyper::service::service_fn(move |request| {
                            let (routes, hits, hold) = (routes.clone(), hits.clone(), hold.clone());
                            async move {
                                Ok::<_, std::convert::Infallible>(
                                    answer(&routes, &hits, &hold, request).await,
                                )
                            }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), service)
                            .await;
                    });
                }
            }
        });
        StandIn {
            addr,
            ca,
            routes,
            hits,
            hold,
            server,
        }
    }

    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    fn serve(&self, path: &str, reply: Reply) {
        self.routes.lock().unwrap().insert(path.to_owned(), reply);
    }

    fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    /// Publishes itself as the issuer `issuer`, with `keys` at [`JWKS`]; returns the key set
    /// document as served.
    fn publish(&self, issuer: &str, keys: &[Value]) -> String {
        let discovery = json!({
            "issuer": issuer,
            "jwks_uri": format!("{}{JWKS}", self.url()),
            "authorization_endpoint": format!("{}/authorize", self.url()),
            "id_token_signing_alg_values_supported": ["RS256", "ES256"],
        });
        self.serve(DISCOVERY, Reply::ok(discovery.to_string()));
        let document = json!({ "keys": keys }).to_string();
        self.serve(JWKS, Reply::ok(document.clone()));
        document
    }

    /// A source for the issuer at its own URL, trusting its CA.
    fn source(&self) -> IssuerSource {
        IssuerSource {
            url: self.url(),
            discovery_url: None,
            certificate_authority: Some(self.ca.clone()),
        }
    }
}

async fn answer(
    routes: &Mutex<HashMap<String, Reply>>,
    hits: &Mutex<HashMap<String, usize>>,
    hold: &RwLock<()>,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    *hits.lock().unwrap().entry(path.clone()).or_default() += 1;
    if path == JWKS {
        drop(hold.read().await);
    }
    let reply = routes.lock().unwrap().get(&path).cloned();
    let reply = reply.unwrap_or_else(|| Reply::status(404));
    let mut response = Response::builder().status(reply.status);
    if let Some(location) = reply.location {
        response = response.header(http::header::LOCATION, location);
    }
    response.body(Full::new(reply.body)).unwrap()
}

/// The issuer's signing keys: the RSA test key and EC keys made here, by key id.
struct Signers {
    rsa: RsaKeyPair,
    p256: EcdsaKeyPair,
    p384: EcdsaKeyPair,
}

fn ec_pair(algorithm: &'static EcdsaSigningAlgorithm) -> EcdsaKeyPair {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(algorithm, &rng).unwrap();
    EcdsaKeyPair::from_pkcs8(algorithm, pkcs8.as_ref(), &rng).unwrap()
}

fn ec_jwk(pair: &EcdsaKeyPair, curve: &str, kid: &str) -> Value {
    let point = pair.public_key().as_ref();
    let half = (point.len() - 1) / 2;
    json!({"kty": "EC", "crv": curve, "kid": kid, "use": "sig",
           "x": b64(&point[1..=half]), "y": b64(&point[1 + half..])})
}

impl Signers {
    fn new() -> Signers {
        let pem = text(JWT_ISSUER_RSA_KEY);
        let der = PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes()).unwrap();
        Signers {
            rsa: RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).unwrap(),
            p256: ec_pair(&ECDSA_P256_SHA256_FIXED_SIGNING),
            p384: ec_pair(&ECDSA_P384_SHA384_FIXED_SIGNING),
        }
    }

    fn rsa_jwk(&self, kid: &str) -> Value {
        let public = ring::rsa::PublicKeyComponents::<Vec<u8>>::from(self.rsa.public());
        json!({"kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig",
               "n": b64(&public.n), "e": b64(&public.e)})
    }

    /// The RSA key as `rsa`, P-256 as `p256`, P-384 as `p384`.
    fn jwks(&self) -> Vec<Value> {
        vec![
            self.rsa_jwk("rsa"),
            ec_jwk(&self.p256, "P-256", "p256"),
            ec_jwk(&self.p384, "P-384", "p384"),
        ]
    }

    fn rsa(&self, padding: &'static dyn RsaEncoding) -> Vec<u8> {
        let mut signature = vec![0; self.rsa.public().modulus_len()];
        self.rsa
            .sign(padding, &SystemRandom::new(), INPUT, &mut signature)
            .unwrap();
        signature
    }

    fn ec(pair: &EcdsaKeyPair) -> Vec<u8> {
        pair.sign(&SystemRandom::new(), INPUT)
            .unwrap()
            .as_ref()
            .to_vec()
    }
}

/// The issuer's keys with waits of `cooldown` between fetches unknown key ids ask for, and
/// neither retries nor refreshes, and the registry their metrics are in.
fn keys_with(
    source: IssuerSource,
    cooldown: Duration,
) -> (Arc<IssuerKeys>, prometheus_client::registry::Registry) {
    let mut registry = crate::base::metrics::registry();
    let metrics = KeysMetrics::register(&mut registry);
    let timing = Timing {
        retry: NEVER,
        refresh: NEVER,
        cooldown,
    };
    let keys = IssuerKeys::with_timing(source, metrics, timing).unwrap();
    (keys, registry)
}

/// Waits until `condition` holds; fails the test after [`WAIT`].
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let waited = tokio::time::timeout(WAIT, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "still not so after {WAIT:?}: {what}");
}

#[tokio::test]
async fn tokens_of_each_allowed_kind_verify_with_the_keys_fetched_through_the_configured_ca() {
    let issuer = StandIn::start().await;
    let signers = Signers::new();
    issuer.publish(&issuer.url(), &signers.jwks());
    let (keys, _) = keys_with(issuer.source(), NEVER);

    // Before the first fetch every token waits for the issuer, and nothing is asked of it.
    let rs256 = signers.rsa(&RSA_PKCS1_SHA256);
    assert_eq!(
        keys.verify("RS256", "rsa", INPUT, &rs256).await,
        Verdict::NotReady
    );
    assert_eq!(issuer.hits(DISCOVERY) + issuer.hits(JWKS), 0);

    keys.refresh(Duration::ZERO).await;
    assert_eq!((issuer.hits(DISCOVERY), issuer.hits(JWKS)), (1, 1));
    let p256 = Signers::ec(&signers.p256);
    for (algorithm, kid, signature) in [
        ("RS256", "rsa", rs256.clone()),
        ("RS512", "rsa", signers.rsa(&RSA_PKCS1_SHA512)),
        ("PS256", "rsa", signers.rsa(&RSA_PSS_SHA256)),
        ("ES256", "p256", p256.clone()),
        ("ES384", "p384", Signers::ec(&signers.p384)),
    ] {
        assert_eq!(
            keys.verify(algorithm, kid, INPUT, &signature).await,
            Verdict::Verified,
            "{algorithm}"
        );
        // Naming no key: every key that fits the algorithm is tried.
        assert_eq!(
            keys.verify(algorithm, "", INPUT, &signature).await,
            Verdict::Verified,
            "{algorithm} without kid"
        );
        let mut altered = signature.clone();
        altered[7] ^= 1;
        assert_eq!(
            keys.verify(algorithm, kid, INPUT, &altered).await,
            Verdict::Refused(KeyRefusal::Signature),
            "{algorithm} altered"
        );
        assert_eq!(
            keys.verify(algorithm, kid, b"other.input", &signature)
                .await,
            Verdict::Refused(KeyRefusal::Signature),
            "{algorithm} over another input"
        );
    }
    // A PKCS#1 signature is not a PSS one, and a key of one curve is not the other's.
    assert_eq!(
        keys.verify("PS256", "rsa", INPUT, &rs256).await,
        Verdict::Refused(KeyRefusal::Signature)
    );
    for (algorithm, kid) in [("ES256", "rsa"), ("ES384", "p256"), ("RS256", "p256")] {
        assert_eq!(
            keys.verify(algorithm, kid, INPUT, &p256).await,
            Verdict::Refused(KeyRefusal::Algorithm),
            "{algorithm} named {kid}"
        );
    }
    // Outside kube-apiserver's allowlist, and ES512, which is in it but not verified here.
    for algorithm in ["ES512", "HS256", "none", "EdDSA", "rs256", ""] {
        assert_eq!(
            keys.verify(algorithm, "rsa", INPUT, &rs256).await,
            Verdict::Refused(KeyRefusal::Algorithm),
            "{algorithm:?}"
        );
    }
    // None of these asked for the keys again.
    assert_eq!(issuer.hits(JWKS), 1);
}

#[tokio::test]
async fn a_discovery_document_naming_another_issuer_is_refused() {
    let issuer = StandIn::start().await;
    let signers = Signers::new();
    issuer.publish(&issuer.url(), &signers.jwks());
    // The configuration has a trailing slash the document's issuer has not.
    let configured = format!("{}/", issuer.url());
    let (keys, _) = keys_with(
        IssuerSource {
            url: configured.clone(),
            ..issuer.source()
        },
        NEVER,
    );
    let error = keys.probe().await.unwrap_err();
    assert!(
        matches!(error, FetchError::IssuerMismatch { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains(&format!(
            "oidc: issuer did not match the issuer returned by provider, expected {configured:?} got {:?}",
            issuer.url()
        )),
        "{error}"
    );
    assert_eq!(error.cause(), "issuer_mismatch");
    assert!(error.hint().contains("exactly"), "{}", error.hint());
    // One trailing slash is dropped before the well-known path, as go-oidc does; the key set is
    // never asked for.
    assert_eq!((issuer.hits(DISCOVERY), issuer.hits(JWKS)), (1, 0));
    keys.refresh(Duration::ZERO).await;
    assert_eq!(
        keys.verify("RS256", "rsa", INPUT, &signers.rsa(&RSA_PKCS1_SHA256))
            .await,
        Verdict::NotReady
    );
}

#[tokio::test]
async fn the_discovery_url_replaces_the_well_known_path() {
    let issuer = StandIn::start().await;
    let signers = Signers::new();
    let url = format!("{}/tenant", issuer.url());
    issuer.publish(&url, &signers.jwks());
    let document = issuer.routes.lock().unwrap()[DISCOVERY].clone();
    issuer.serve("/tenant/discovery?v=2", document);
    issuer.serve(DISCOVERY, Reply::status(500));
    let source = IssuerSource {
        url,
        discovery_url: Some(format!("{}/tenant/discovery?v=2", issuer.url())),
        certificate_authority: Some(issuer.ca.clone()),
    };
    let (keys, _) = keys_with(source, NEVER);
    let report = keys.probe().await.unwrap();
    assert_eq!(
        report.discovery_url,
        format!("{}/tenant/discovery?v=2", issuer.url())
    );
    assert_eq!(report.jwks_uri, format!("{}{JWKS}", issuer.url()));
    let mut usable = report.usable.clone();
    usable.sort();
    assert_eq!(
        usable,
        [
            ("p256".to_owned(), "EC P-256".to_owned()),
            ("p384".to_owned(), "EC P-384".to_owned()),
            ("rsa".to_owned(), "RSA 2048-bit".to_owned()),
        ]
    );
    assert!(report.skipped.is_empty());
    assert_eq!(issuer.hits("/tenant/discovery?v=2"), 1);
    assert_eq!(issuer.hits(DISCOVERY), 0);
}

#[tokio::test]
async fn redirects_are_followed_as_go_follows_them_and_only_to_https() {
    let issuer = StandIn::start().await;
    let signers = Signers::new();
    issuer.publish(&issuer.url(), &signers.jwks());
    let discovery = json!({"issuer": issuer.url(), "jwks_uri": format!("{}/r/0", issuer.url())});
    issuer.serve(DISCOVERY, Reply::ok(discovery.to_string()));
    let statuses = [301, 302, 303, 307, 308];
    // Nine redirects (ten requests): the last one relative to /r/8.
    for hop in 0..8 {
        issuer.serve(
            &format!("/r/{hop}"),
            Reply::redirect(statuses[hop % 5], &format!("/r/{}", hop + 1)),
        );
    }
    issuer.serve("/r/8", Reply::redirect(302, "../jwks"));
    let (keys, _) = keys_with(issuer.source(), NEVER);
    let report = keys.probe().await.unwrap();
    assert_eq!(report.usable.len(), 3);
    assert_eq!(issuer.hits(JWKS), 1);

    // A tenth redirect is one too many (Go: "stopped after 10 redirects").
    issuer.serve("/r/8", Reply::redirect(307, "/r/9"));
    issuer.serve("/r/9", Reply::redirect(302, JWKS));
    let error = keys.probe().await.unwrap_err();
    assert!(
        matches!(
            &error,
            FetchError::Request {
                source: RequestError::Redirects,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("stopped after 10 redirects"));
    assert_eq!((issuer.hits("/r/9"), issuer.hits(JWKS)), (1, 1));

    // Never to plain HTTP, even on the same host.
    issuer.serve(
        "/r/0",
        Reply::redirect(302, &format!("http://{}{JWKS}", issuer.addr)),
    );
    let error = keys.probe().await.unwrap_err();
    assert!(
        matches!(
            &error,
            FetchError::Request {
                source: RequestError::NotHttps(_),
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(issuer.hits(JWKS), 1);
    // A redirect without Location is an answer, and not 200.
    issuer.serve("/r/0", Reply::status(302));
    let error = keys.probe().await.unwrap_err();
    assert_eq!(error.cause(), "status", "{error}");
}

#[tokio::test]
async fn a_document_past_the_size_bound_is_refused() {
    let issuer = StandIn::start().await;
    issuer.publish(&issuer.url(), &[]);
    let (keys, _) = keys_with(issuer.source(), NEVER);
    // Exactly the bound: read.
    let head = r#"{"keys":[]}"#;
    let padded = format!("{head}{}", " ".repeat(MAX_DOCUMENT_BYTES - head.len()));
    issuer.serve(JWKS, Reply::ok(padded));
    let report = keys.probe().await.unwrap();
    assert!(report.usable.is_empty());
    // One byte more: refused, whatever it holds.
    let padded = format!("{head}{}", " ".repeat(MAX_DOCUMENT_BYTES + 1 - head.len()));
    issuer.serve(JWKS, Reply::ok(padded));
    let error = keys.probe().await.unwrap_err();
    assert!(
        matches!(
            &error,
            FetchError::Request {
                source: RequestError::TooLarge,
                ..
            }
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn an_issuer_whose_certificate_the_configured_ca_did_not_sign_is_a_tls_failure() {
    let issuer = StandIn::start().await;
    issuer.publish(&issuer.url(), &[]);
    let (_, other_ca) = issuer_tls();
    let (keys, _) = keys_with(
        IssuerSource {
            certificate_authority: Some(other_ca),
            ..issuer.source()
        },
        NEVER,
    );
    let error = keys.probe().await.unwrap_err();
    assert_eq!(error.cause(), "tls", "{error:?}");
    assert!(error.hint().contains("certificateAuthority"));
    assert_eq!(issuer.hits(DISCOVERY), 0);

    // And what cannot be set up at all.
    let mut registry = crate::base::metrics::registry();
    let metrics = KeysMetrics::register(&mut registry);
    for (source, field) in [
        (
            IssuerSource {
                certificate_authority: Some("not PEM".to_owned()),
                ..issuer.source()
            },
            "certificateAuthority",
        ),
        (
            IssuerSource {
                url: format!("http://{}", issuer.addr),
                ..issuer.source()
            },
            "url",
        ),
        (
            IssuerSource {
                discovery_url: Some("ftp://example.com/x".to_owned()),
                ..issuer.source()
            },
            "discoveryURL",
        ),
    ] {
        let error = IssuerKeys::new(source, metrics.clone()).unwrap_err();
        assert!(error.to_string().starts_with(field), "{error}");
    }
}

#[tokio::test]
async fn a_key_published_after_the_last_fetch_is_fetched_for_the_token_naming_it() {
    let issuer = StandIn::start().await;
    let signers = Signers::new();
    let mut published = signers.jwks();
    issuer.publish(&issuer.url(), &published);
    let (keys, _) = keys_with(issuer.source(), Duration::ZERO);
    keys.refresh(Duration::ZERO).await;

    let rotated = ec_pair(&ECDSA_P256_SHA256_FIXED_SIGNING);
    published.push(ec_jwk(&rotated, "P-256", "p256-b"));
    issuer.publish(&issuer.url(), &published);
    let signature = Signers::ec(&rotated);
    assert_eq!(
        keys.verify("ES256", "p256-b", INPUT, &signature).await,
        Verdict::Verified
    );
    assert_eq!(issuer.hits(JWKS), 2);
    // A key id still unknown after the fetch it asked for is refused.
    assert_eq!(
        keys.verify("ES256", "nobody", INPUT, &signature).await,
        Verdict::Refused(KeyRefusal::UnknownKey)
    );
    assert_eq!(issuer.hits(JWKS), 3);
    // A failed fetch keeps the keys held.
    issuer.serve(JWKS, Reply::status(503));
    keys.refresh(Duration::ZERO).await;
    assert_eq!(issuer.hits(JWKS), 4);
    assert_eq!(
        keys.verify("ES256", "p256-b", INPUT, &signature).await,
        Verdict::Verified
    );
}

#[tokio::test]
async fn unknown_key_ids_ask_for_one_fetch_per_cooldown() {
    let issuer = StandIn::start().await;
    let signers = Signers::new();
    let mut published = signers.jwks();
    issuer.publish(&issuer.url(), &published);
    let (keys, _) = keys_with(issuer.source(), REFETCH_COOLDOWN);
    keys.refresh(Duration::ZERO).await;

    let rotated = ec_pair(&ECDSA_P256_SHA256_FIXED_SIGNING);
    let signature = Signers::ec(&rotated);
    // Within the cooldown of the last fetch an unknown key id is refused without a fetch, even
    // once the issuer publishes it.
    assert_eq!(
        keys.verify("ES256", "p256-b", INPUT, &signature).await,
        Verdict::Refused(KeyRefusal::UnknownKey)
    );
    published.push(ec_jwk(&rotated, "P-256", "p256-b"));
    issuer.publish(&issuer.url(), &published);
    assert_eq!(
        keys.verify("ES256", "p256-b", INPUT, &signature).await,
        Verdict::Refused(KeyRefusal::UnknownKey)
    );
    assert_eq!(issuer.hits(JWKS), 1);

    // Past it, the next one fetches; the one after is within the cooldown of that fetch again.
    tokio::time::pause();
    tokio::time::advance(REFETCH_COOLDOWN + Duration::from_secs(1)).await;
    tokio::time::resume();
    assert_eq!(
        keys.verify("ES256", "p256-b", INPUT, &signature).await,
        Verdict::Verified
    );
    assert_eq!(issuer.hits(JWKS), 2);
    assert_eq!(
        keys.verify("ES256", "invented", INPUT, &signature).await,
        Verdict::Refused(KeyRefusal::UnknownKey)
    );
    assert_eq!(issuer.hits(JWKS), 2);
}

#[tokio::test]
async fn concurrent_tokens_naming_a_new_key_share_one_fetch() {
    let issuer = StandIn::start().await;
    let signers = Signers::new();
    let mut published = signers.jwks();
    issuer.publish(&issuer.url(), &published);
    // No cooldown: only the sharing of the fetch under way keeps these to one.
    let (keys, _) = keys_with(issuer.source(), Duration::ZERO);
    keys.refresh(Duration::ZERO).await;
    let rotated = ec_pair(&ECDSA_P256_SHA256_FIXED_SIGNING);
    published.push(ec_jwk(&rotated, "P-256", "p256-b"));
    issuer.publish(&issuer.url(), &published);
    let signature = Signers::ec(&rotated);

    // The key set answers wait until the test lets them go; every token is spawned (and, on
    // this single-threaded runtime, reaches the fetch or waits for it) before that.
    let held = issuer.hold.write().await;
    let tokens: Vec<_> = (0..5)
        .map(|_| {
            let (keys, signature) = (Arc::clone(&keys), signature.clone());
            tokio::spawn(async move { keys.verify("ES256", "p256-b", INPUT, &signature).await })
        })
        .collect();
    eventually("the fetch for the new key reached the issuer", || {
        issuer.hits(JWKS) == 2
    })
    .await;
    drop(held);
    for token in tokens {
        assert_eq!(token.await.unwrap(), Verdict::Verified);
    }
    assert_eq!((issuer.hits(DISCOVERY), issuer.hits(JWKS)), (2, 2));
}

#[tokio::test]
async fn the_refresh_task_retries_until_keys_are_held_and_ends_with_the_last_reference() {
    let issuer = StandIn::start().await;
    let signers = Signers::new();
    issuer.publish(&issuer.url(), &signers.jwks());
    issuer.serve(DISCOVERY, Reply::status(503));
    let mut registry = crate::base::metrics::registry();
    let metrics = KeysMetrics::register(&mut registry);
    let timing = Timing {
        retry: Duration::from_millis(1),
        refresh: NEVER,
        cooldown: NEVER,
    };
    let keys = IssuerKeys::with_timing(issuer.source(), metrics, timing).unwrap();
    keys.spawn();
    keys.spawn();
    eventually("a failed fetch", || issuer.hits(DISCOVERY) >= 2).await;
    assert_eq!(issuer.hits(JWKS), 0);
    issuer.publish(&issuer.url(), &signers.jwks());
    eventually("the keys fetched", || keys.keys.load().is_some()).await;
    let rs256 = signers.rsa(&RSA_PKCS1_SHA256);
    assert_eq!(
        keys.verify("RS256", "rsa", INPUT, &rs256).await,
        Verdict::Verified
    );
    // Once keys are held the next fetch is a refresh away: this one and no other.
    assert_eq!(issuer.hits(JWKS), 1);
    let text = crate::base::metrics::encode(&registry);
    let issuer_hash = hash_label(issuer.url().as_bytes());
    assert!(
        text.contains(&format!(
            "jwt_authenticator_jwks_fetches_total{{jwt_issuer_hash=\"{issuer_hash}\",result=\"success\"}} 1\n"
        )),
        "{text}"
    );

    // Between fetches the task holds no reference: the last one dropped, the keys go and the
    // task is told to end.
    eventually("the task dropped its reference", || {
        Arc::strong_count(&keys) == 1
    })
    .await;
    let (weak, stop) = (Arc::downgrade(&keys), keys.stop.clone());
    assert!(!stop.is_cancelled());
    drop(keys);
    assert!(weak.upgrade().is_none());
    assert!(stop.is_cancelled());
}

/// The value of the series `name{labels}` in `text`, if exported.
fn series(text: &str, name: &str, labels: &str) -> Option<String> {
    let prefix = format!("kubelet_auth_proxy_{name}{{{labels}}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map(str::to_owned)
}

#[tokio::test]
async fn the_fetch_metrics_follow_kube_apiservers() {
    // kube-apiserver's own vectors (k8s.io/apiserver oidc metrics_test.go).
    assert_eq!(
        hash_label(b"testIssuer"),
        "sha256:29b34beedc55b972f2428f21bc588f9d38e5e8f7a7af825486e7bb4fd9caa2ad"
    );
    assert_eq!(
        hash_label(br#"{"keys":[{"kty":"RSA","use":"sig","kid":"test"}]}"#),
        "sha256:d132d414ef2da3d863abd7bf0165c00403ef1d3510faf8fdf1d7cf335c888e53"
    );
    assert_eq!(hash_label(b""), "");

    let issuer = StandIn::start().await;
    let signers = Signers::new();
    let first = issuer.publish(&issuer.url(), &signers.jwks()[..1]);
    let mut registry = crate::base::metrics::registry();
    let metrics = KeysMetrics::register(&mut registry);
    let keys = IssuerKeys::new(issuer.source(), metrics.clone()).unwrap();
    let issuer_hash = hash_label(issuer.url().as_bytes());
    let fetches = |text: &str, result: &str| {
        series(
            text,
            "jwt_authenticator_jwks_fetches_total",
            &format!("jwt_issuer_hash=\"{issuer_hash}\",result=\"{result}\""),
        )
    };
    let key_set = |text: &str, document: &str| {
        series(
            text,
            "jwt_authenticator_jwks_fetch_last_key_set_info",
            &format!(
                "jwt_issuer_hash=\"{issuer_hash}\",hash=\"{}\"",
                hash_label(document.as_bytes())
            ),
        )
    };
    let stamped = |text: &str, result: &str| {
        series(
            text,
            "jwt_authenticator_jwks_fetch_last_timestamp_seconds",
            &format!("jwt_issuer_hash=\"{issuer_hash}\",result=\"{result}\""),
        )
        .is_some()
    };
    let text = crate::base::metrics::encode(&registry);
    assert_eq!(fetches(&text, "success").as_deref(), Some("0"));
    assert_eq!(fetches(&text, "failure").as_deref(), Some("0"));
    assert!(!stamped(&text, "success") && !stamped(&text, "failure"));

    keys.refresh(Duration::ZERO).await;
    let text = crate::base::metrics::encode(&registry);
    assert_eq!(fetches(&text, "success").as_deref(), Some("1"), "{text}");
    assert_eq!(key_set(&text, &first).as_deref(), Some("1"), "{text}");
    assert!(stamped(&text, "success") && !stamped(&text, "failure"));
    assert_eq!(
        series(
            &text,
            "jwt_authenticator_jwks_fetch_duration_seconds_count",
            &format!("jwt_issuer_hash=\"{issuer_hash}\"")
        )
        .as_deref(),
        Some("1")
    );

    // A new key set: only its hash is shown.
    let second = issuer.publish(&issuer.url(), &signers.jwks());
    keys.refresh(Duration::ZERO).await;
    let text = crate::base::metrics::encode(&registry);
    assert_eq!(key_set(&text, &first), None, "{text}");
    assert_eq!(key_set(&text, &second).as_deref(), Some("1"));
    assert_eq!(fetches(&text, "success").as_deref(), Some("2"));

    // A failure keeps the last key set's hash.
    issuer.serve(JWKS, Reply::status(500));
    keys.refresh(Duration::ZERO).await;
    let text = crate::base::metrics::encode(&registry);
    assert_eq!(fetches(&text, "failure").as_deref(), Some("1"));
    assert!(stamped(&text, "failure"));
    assert_eq!(key_set(&text, &second).as_deref(), Some("1"));
    // No URL is ever a label.
    assert!(!text.contains(&issuer.addr.to_string()), "{text}");

    // Another holder of the issuer (a reloaded configuration) keeps the series; the last one
    // dropped takes them away.
    let again = IssuerKeys::new(issuer.source(), metrics).unwrap();
    drop(keys);
    let text = crate::base::metrics::encode(&registry);
    assert_eq!(key_set(&text, &second).as_deref(), Some("1"));
    drop(again);
    let text = crate::base::metrics::encode(&registry);
    assert!(!text.contains(&issuer_hash), "{text}");
}

// --- The key set as go-jose reads it, and the key chosen. ---

fn parsed(document: &Value) -> Result<KeySet, JwksError> {
    jwks::parse(document.to_string().as_bytes())
}

fn bad_key(document: &Value) -> BadKey {
    match parsed(&json!({ "keys": [document] })) {
        Err(JwksError::Key { why, .. }) => why,
        other => panic!("{document}: {other:?}"),
    }
}

/// RFC 7520 section 3.1's P-521 public key.
fn p521_jwk(kid: &str) -> Value {
    json!({"kty": "EC", "crv": "P-521", "kid": kid,
        "x": "AHKZLLOsCOzz5cY97ewNUajB957y-C-U88c3v13nmGZx6sYl_oJXu9A5RkTKqjqvjyekWF-7ytDyRXYgCF5cj0Kt",
        "y": "AdymlHvOiLxXkEhayXQnNCvDX4h9htZaCJN34kfmC6pV5OhQHiraVySsUdaQkAgDPrwQrJmbnX9cwlGfP-HqHZR1"})
}

#[test]
fn go_jose_reads_keys_whatever_their_use_alg_and_padding() {
    let signers = Signers::new();
    let public = ring::rsa::PublicKeyComponents::<Vec<u8>>::from(signers.rsa.public());
    let mut n = vec![0u8];
    n.extend_from_slice(&public.n);
    // Published for encryption, for another algorithm, with padding and a leading zero byte.
    let key = json!({"kty": "RSA", "kid": "enc", "use": "enc", "alg": "RSA-OAEP",
        "n": URL_SAFE_NO_PAD.encode(&n) + "=", "e": "AQAB"});
    let set = parsed(&json!({ "keys": [key] })).unwrap();
    let rs256 = signers.rsa(&RSA_PKCS1_SHA256);
    assert_eq!(
        set.choose(Algorithm::Rs256, "enc", INPUT, &rs256),
        Choice::Verified
    );
    assert_eq!(set.keys[0].kind(), "RSA 2048-bit");
    for empty in [
        json!(null),
        json!({}),
        json!({"keys": null}),
        json!({"keys": []}),
    ] {
        let set = parsed(&empty).unwrap();
        assert!(set.keys.is_empty() && set.skipped.is_empty(), "{empty}");
    }
}

#[test]
fn keys_go_jose_reads_but_that_verify_nothing_here_are_set_apart() {
    let small_modulus = b64(&[0xc5; 128]);
    let set = parsed(&json!({"keys": [
        p521_jwk("p521"),
        {"kty": "RSA", "kid": "small", "n": small_modulus, "e": "AQAB"},
        {"kty": "RSA", "kid": "even", "n": b64(&[0xc5; 256]), "e": "AQAA"},
        {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},
        {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": b64(&[7; 32])},
        {"kty": "EC", "crv": "P-256", "kid": "private", "x": b64(&[1; 32]), "y": b64(&[2; 32]), "d": b64(&[3; 32])},
    ]}))
    .unwrap();
    assert!(set.keys.is_empty());
    let skipped: Vec<(&str, Unusable)> = set
        .skipped
        .iter()
        .map(|key| (key.kid.as_str(), key.why))
        .collect();
    assert_eq!(
        skipped,
        [
            ("p521", Unusable::P521),
            ("small", Unusable::RsaSize(1024)),
            ("even", Unusable::RsaExponent),
            ("hmac", Unusable::Symmetric),
            ("ed", Unusable::Ed25519),
            ("private", Unusable::Private),
        ]
    );
    // A token naming one is refused for its algorithm, without asking for the set again; a
    // token naming none may have been made with the small RSA key only if it is RSA.
    for (algorithm, kid) in [
        (Algorithm::Es256, "p521"),
        (Algorithm::Rs256, "small"),
        (Algorithm::Rs256, "hmac"),
        (Algorithm::Rs256, ""),
    ] {
        assert_eq!(
            set.choose(algorithm, kid, INPUT, b"sig"),
            Choice::Refused(KeyRefusal::Algorithm),
            "{algorithm:?} {kid:?}"
        );
    }
    assert_eq!(
        set.choose(Algorithm::Es256, "", INPUT, b"sig"),
        Choice::Unknown
    );
    assert_eq!(
        set.choose(Algorithm::Rs256, "nobody", INPUT, b"sig"),
        Choice::Unknown
    );
    assert_eq!(
        Unusable::P521.to_string(),
        "EC P-521 (ES512) cannot be verified here"
    );
}

#[test]
fn a_key_go_jose_refuses_makes_the_whole_set_unusable() {
    let ec = |crv: &str, x: &[u8], y: &[u8]| json!({"kty": "EC", "crv": crv, "kid": "k", "x": b64(x), "y": b64(y)});
    for (key, expected) in [
        (
            json!({"kty": "AKP", "kid": "k"}),
            BadKey::Type("AKP".into()),
        ),
        (json!({"kid": "k"}), BadKey::Type(String::new())),
        (
            ec("secp256k1", &[1; 32], &[2; 32]),
            BadKey::Curve("secp256k1".into()),
        ),
        (
            ec("P-256", &[1; 31], &[2; 32]),
            BadKey::Length {
                member: "x",
                have: 31,
                want: 32,
            },
        ),
        (
            json!({"kty": "EC", "crv": "P-384", "x": b64(&[1; 48])}),
            BadKey::Missing("y"),
        ),
        (json!({"kty": "RSA", "n": "AQAB"}), BadKey::Missing("e")),
        (
            json!({"kty": "RSA", "n": "!!", "e": "AQAB"}),
            BadKey::Base64("n"),
        ),
        (
            json!({"kty": "OKP", "crv": "X25519", "x": b64(&[1; 32])}),
            BadKey::Curve("X25519".into()),
        ),
        (json!({"kty": "oct"}), BadKey::Missing("k")),
        (
            json!({"kty": "oct", "k": "c2VjcmV0", "x5c": [STANDARD.encode(b"x")]}),
            BadKey::Certificate(0),
        ),
    ] {
        assert_eq!(bad_key(&key), expected, "{key}");
    }
    // A member of the wrong JSON type fails the set as Go's encoding/json does.
    for document in [
        json!({"keys": [{"kty": "RSA", "kid": 5, "n": "AQAB", "e": "AQAB"}]}),
        json!({"keys": [{"kty": "RSA", "use": true, "n": "AQAB", "e": "AQAB"}]}),
        json!({"keys": {}}),
        json!({"keys": [[]]}),
        json!([]),
    ] {
        assert!(
            matches!(parsed(&document), Err(JwksError::Json(_))),
            "{document}"
        );
    }
    // One bad key among good ones.
    let signers = Signers::new();
    let mut keys = signers.jwks();
    keys.push(json!({"kty": "EC", "crv": "P-256", "kid": "short", "x": "AQ", "y": "AQ"}));
    assert!(matches!(
        parsed(&json!({ "keys": keys })),
        Err(JwksError::Key { index: 3, .. })
    ));
}

#[test]
fn a_certificate_chain_must_hold_the_keys_own_public_key() {
    let pair = rcgen::KeyPair::generate().unwrap();
    let certificate = rcgen::CertificateParams::new(vec!["issuer.test".to_owned()])
        .unwrap()
        .self_signed(&pair)
        .unwrap();
    let der = certificate.der().as_ref().to_vec();
    let point = pair.public_key_raw();
    let key = |x5c: &str, x5t: &str| {
        json!({"kty": "EC", "crv": "P-256", "kid": "certified",
            "x": b64(&point[1..33]), "y": b64(&point[33..]),
            "x5c": [x5c], "x5t#S256": x5t})
    };
    let sha256 = ring::digest::digest(&ring::digest::SHA256, &der);
    let set =
        parsed(&json!({"keys": [key(&STANDARD.encode(&der), &b64(sha256.as_ref()))]})).unwrap();
    assert_eq!(set.keys.len(), 1);

    let other = rcgen::KeyPair::generate().unwrap();
    let other_der = rcgen::CertificateParams::new(vec!["other.test".to_owned()])
        .unwrap()
        .self_signed(&other)
        .unwrap()
        .der()
        .as_ref()
        .to_vec();
    assert_eq!(
        bad_key(&key(&STANDARD.encode(&other_der), "")),
        BadKey::CertificateMismatch
    );
    assert_eq!(
        bad_key(&key(&STANDARD.encode(&der), &b64(&[0; 32]))),
        BadKey::Thumbprint("x5t#S256")
    );
    assert_eq!(
        bad_key(&key(&STANDARD.encode(&der), &b64(&[0; 20]))),
        BadKey::Thumbprint("x5t#S256")
    );
    assert_eq!(bad_key(&key("%%", "")), BadKey::Base64("x5c"));
}

#[test]
fn redirect_locations_resolve_as_go_resolves_them() {
    let base: Uri = "https://issuer.test:8443/a/b/c?q=1".parse().unwrap();
    for (location, expected) in [
        ("d", "https://issuer.test:8443/a/b/d"),
        ("../d", "https://issuer.test:8443/a/d"),
        ("./", "https://issuer.test:8443/a/b/"),
        (
            "/x/./y/../z?k=v#fragment",
            "https://issuer.test:8443/x/z?k=v",
        ),
        ("?k=2", "https://issuer.test:8443/a/b/c?k=2"),
        ("//other.test/keys", "https://other.test/keys"),
        ("https://other.test/keys", "https://other.test/keys"),
        ("http://other.test/keys", "http://other.test/keys"),
        ("/..", "https://issuer.test:8443/"),
    ] {
        assert_eq!(resolve(&base, location), expected, "{location}");
    }
}
