//! A stand-in OpenID Connect provider for the `--authentication-config` scenarios: several
//! issuers on one HTTPS listener on loopback (`https://127.0.0.1:PORT/<name>`), each with its
//! discovery document (`<url>/.well-known/openid-configuration`, and the same document at
//! `/discovery/<name>` for a `discoveryURL`) and its key set (`<url>/jwks`), under a CA of its
//! own (rcgen) that the authentication config names inline. Keys are published and withdrawn
//! while it runs (rotation); every request is counted by path, so a scenario can tell how often
//! the keys were fetched.
//!
//! Tokens are minted here too, from any header and claims: RS256/384/512 and PS256/384/512 with
//! the one RSA key
//! (`tests/data/jwt-issuer-rsa-key.pem`, a test fixture: ring signs RSA but cannot generate RSA
//! keys), ES256 and ES384 with EC keys generated for each test; and deliberately broken ones (a
//! signature that does not verify, HS256, `alg: none`). The kid a header names is whatever the
//! scenario writes into it, so an unknown kid is just another header.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use kubelet_auth_proxy::tools::demo::accept::until_stopped;
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, ECDSA_P384_SHA384_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _,
    RSA_PKCS1_SHA256, RSA_PKCS1_SHA384, RSA_PKCS1_SHA512, RSA_PSS_SHA256, RSA_PSS_SHA384,
    RSA_PSS_SHA512, RsaKeyPair, RsaPublicKeyComponents,
};
use rustls::ServerConfig;
use rustls::pki_types::PrivatePkcs8KeyDer;
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use super::pki::{Authority, CertSpec};
use super::within;

/// The RSA test key every RSA-signed token is signed with (PKCS#8 PEM, made once with
/// `openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048`; a fixture, not a secret).
pub const RSA_KEY_FILE: &str = "tests/data/jwt-issuer-rsa-key.pem";
/// The path of an issuer's discovery document below its URL.
pub const DISCOVERY_SUFFIX: &str = "/.well-known/openid-configuration";
/// The path of an issuer's key set below its URL.
pub const JWKS_SUFFIX: &str = "/jwks";
/// Where each issuer's discovery document is also served, for a `discoveryURL` that is not
/// below the issuer's URL: `/discovery/<name>`.
pub const ALTERNATE_DISCOVERY_PREFIX: &str = "/discovery/";
/// Bounds a TLS handshake so a stalled client cannot keep a task alive.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What signs: the RSA fixture or a fresh EC key.
enum Material {
    Rsa(RsaKeyPair),
    P256(EcdsaKeyPair),
    P384(EcdsaKeyPair),
}

/// A signing key and the id (`kid`) it is published and named under. Cheap to clone.
#[derive(Clone)]
pub struct Key {
    kid: String,
    material: Arc<Material>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({}, {})", self.kid, self.default_alg())
    }
}

impl Key {
    /// The RSA fixture ([`RSA_KEY_FILE`]) under `kid`: signs RS256/384/512 and PS256/384/512.
    pub fn rsa(kid: &str) -> Key {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(RSA_KEY_FILE);
        let der = PrivatePkcs8KeyDer::from_pem_file(&path)
            .unwrap_or_else(|e| panic!("test data {}: no PKCS#8 key: {e}", path.display()));
        let pair = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der())
            .unwrap_or_else(|e| panic!("test data {}: not an RSA key: {e}", path.display()));
        Key {
            kid: kid.to_owned(),
            material: Arc::new(Material::Rsa(pair)),
        }
    }

    /// A fresh P-256 key under `kid`: signs ES256.
    pub fn p256(kid: &str) -> Key {
        Key::ec(kid, &ECDSA_P256_SHA256_FIXED_SIGNING, Material::P256)
    }

    /// A fresh P-384 key under `kid`: signs ES384.
    pub fn p384(kid: &str) -> Key {
        Key::ec(kid, &ECDSA_P384_SHA384_FIXED_SIGNING, Material::P384)
    }

    fn ec(
        kid: &str,
        alg: &'static ring::signature::EcdsaSigningAlgorithm,
        wrap: fn(EcdsaKeyPair) -> Material,
    ) -> Key {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        Key {
            kid: kid.to_owned(),
            material: Arc::new(wrap(pair)),
        }
    }

    /// The key id.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The algorithm a token signed with this key usually names: RS256, ES256 or ES384.
    pub fn default_alg(&self) -> &'static str {
        match *self.material {
            Material::Rsa(_) => "RS256",
            Material::P256(_) => "ES256",
            Material::P384(_) => "ES384",
        }
    }

    /// `{"alg": <default alg>, "kid": <kid>, "typ": "JWT"}`: the usual header of this key's tokens.
    pub fn header(&self) -> Value {
        json!({"alg": self.default_alg(), "kid": self.kid, "typ": "JWT"})
    }

    /// The public key as a JWK (`use: sig`, no `alg`: an RSA key verifies RS256 and PS256 alike).
    pub fn jwk(&self) -> Value {
        match &*self.material {
            Material::Rsa(pair) => {
                let public = RsaPublicKeyComponents::<Vec<u8>>::from(pair.public());
                json!({
                    "kty": "RSA", "use": "sig", "kid": self.kid,
                    "n": URL_SAFE_NO_PAD.encode(&public.n),
                    "e": URL_SAFE_NO_PAD.encode(&public.e),
                })
            }
            Material::P256(pair) => ec_jwk(&self.kid, "P-256", pair.public_key().as_ref()),
            Material::P384(pair) => ec_jwk(&self.kid, "P-384", pair.public_key().as_ref()),
        }
    }

    /// A compact JWS of `claims` under `header`, signed with the algorithm `header.alg` names
    /// (RS256, RS384, RS512, PS256, PS384 or PS512 for the RSA key, ES256 for P-256, ES384 for
    /// P-384; anything else is a scenario's mistake and panics). The header is taken as written: its `kid` may name
    /// another key, or be absent.
    pub fn sign(&self, header: &Value, claims: &Value) -> String {
        self.sign_text(&header.to_string(), &claims.to_string())
    }

    /// [`Key::sign`] of a header and claims written as JSON text, byte for byte: for JSON a
    /// `Value` cannot hold (a member twice, odd spacing). The algorithm is the header's `alg`.
    pub fn sign_text(&self, header: &str, claims: &str) -> String {
        let alg: Value =
            serde_json::from_str::<Value>(header).expect("a JSON header")["alg"].clone();
        let alg = alg.as_str().unwrap_or_default();
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(claims)
        );
        let rng = SystemRandom::new();
        let signature = match (&*self.material, alg) {
            (Material::Rsa(pair), "RS256" | "RS384" | "RS512" | "PS256" | "PS384" | "PS512") => {
                let padding: &'static dyn ring::signature::RsaEncoding = match alg {
                    "RS256" => &RSA_PKCS1_SHA256,
                    "RS384" => &RSA_PKCS1_SHA384,
                    "RS512" => &RSA_PKCS1_SHA512,
                    "PS256" => &RSA_PSS_SHA256,
                    "PS384" => &RSA_PSS_SHA384,
                    _ => &RSA_PSS_SHA512,
                };
                let mut signature = vec![0; pair.public().modulus_len()];
                pair.sign(padding, &rng, input.as_bytes(), &mut signature)
                    .unwrap();
                signature
            }
            (Material::P256(pair), "ES256") | (Material::P384(pair), "ES384") => {
                pair.sign(&rng, input.as_bytes()).unwrap().as_ref().to_vec()
            }
            _ => panic!("{self:?} cannot sign {alg}"),
        };
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature))
    }

    /// [`Key::sign`] with [`Key::header`]: the everyday token.
    pub fn token(&self, claims: &Value) -> String {
        self.sign(&self.header(), claims)
    }
}

fn ec_jwk(kid: &str, curve: &str, point: &[u8]) -> Value {
    // The uncompressed point: 0x04 || x || y.
    let size = (point.len() - 1) / 2;
    json!({
        "kty": "EC", "use": "sig", "kid": kid, "crv": curve,
        "x": URL_SAFE_NO_PAD.encode(&point[1..1 + size]),
        "y": URL_SAFE_NO_PAD.encode(&point[1 + size..]),
    })
}

/// `base64url(header).base64url(claims)`.
fn signing_input(header: &Value, claims: &Value) -> String {
    let encode = |value: &Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).unwrap());
    format!("{}.{}", encode(header), encode(claims))
}

/// `token` with one byte of its signature changed: well-formed, signed by nobody.
pub fn with_wrong_signature(token: &str) -> String {
    let (input, signature) = token.rsplit_once('.').expect("a compact JWS");
    let mut bytes = URL_SAFE_NO_PAD
        .decode(signature)
        .expect("a base64url signature");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// `token` with the unused low bits of its signature's last base64url character set: the same
/// bytes for a decoder that ignores those bits, as Go's `base64.RawURLEncoding` (which
/// kube-apiserver decodes tokens with) does.
pub fn with_unused_bits(token: &str) -> String {
    let (head, signature) = token.rsplit_once('.').expect("a compact JWS");
    let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let unused = match signature.len() % 4 {
        2 => 0b1111,
        3 => 0b11,
        _ => panic!("a signature without unused bits"),
    };
    let mut signature = signature.to_owned();
    let last = signature.pop().unwrap();
    let value = alphabet.find(last).unwrap();
    signature.push(alphabet.as_bytes()[value | unused] as char);
    format!("{head}.{signature}")
}

/// `token` with each part padded with `=` to a multiple of four characters (panics when none
/// needs it): base64url that a decoder of unpadded parts refuses.
pub fn with_padding(token: &str) -> String {
    let padded: Vec<String> = token
        .split('.')
        .map(|part| format!("{part}{}", "=".repeat((4 - part.len() % 4) % 4)))
        .collect();
    let padded = padded.join(".");
    assert_ne!(padded, token, "no part of the token needs padding");
    padded
}

/// `claims` under `header` (whose `alg` should say HS256) with an HMAC-SHA256 over `secret`: a
/// symmetric algorithm no OIDC authenticator of kube-apiserver accepts.
pub fn sign_hs256(header: &Value, claims: &Value, secret: &[u8]) -> String {
    let input = signing_input(header, claims);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let tag = ring::hmac::sign(&key, input.as_bytes());
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

/// `claims` under `header` with an empty signature, as `alg: none` writes it.
pub fn unsigned(header: &Value, claims: &Value) -> String {
    format!("{}.", signing_input(header, claims))
}

/// What the connection tasks share with the handle.
#[derive(Default)]
struct State {
    /// The published keys of each issuer, by name, in the order published.
    issuers: BTreeMap<String, Vec<Key>>,
    /// Requests received, by path (query left out), whatever was answered.
    requests: BTreeMap<String, usize>,
}

/// The running stand-in provider. Stops when dropped.
pub struct StandInIssuer {
    ca: Authority,
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: watch::Sender<bool>,
    _accept: JoinHandle<()>,
}

impl StandInIssuer {
    /// Starts on `127.0.0.1:<free port>`, with a CA of its own and the issuers `names` (each
    /// serves `/<name>/…`), none with a key yet.
    pub async fn start(names: &[&str]) -> StandInIssuer {
        let ca = Authority::root("stand-in OIDC issuer CA");
        let serving = ca.issue(&CertSpec::server());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(serving.chain.clone(), serving.key())
            .unwrap();
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        let listener = within(
            "binding the stand-in issuer",
            TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)),
        )
        .await
        .unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            issuers: names
                .iter()
                .map(|name| ((*name).to_owned(), Vec::new()))
                .collect(),
            requests: BTreeMap::new(),
        }));
        let (stop, stop_rx) = watch::channel(false);
        let shared = Arc::clone(&state);
        let accept = tokio::spawn(async move {
            until_stopped(listener, stop_rx, |tcp| {
                serve(tcp, acceptor.clone(), Arc::clone(&shared), addr)
            })
            .await;
        });
        StandInIssuer {
            ca,
            addr,
            state,
            stop,
            _accept: accept,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock is already a failed test; keep serving what is left.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The CA of its serving certificate, in PEM: an authenticator's `certificateAuthority`.
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// `https://127.0.0.1:PORT/<name>`: the issuer's URL, its tokens' `iss`.
    pub fn url(&self, name: &str) -> String {
        format!("https://{}/{name}", self.addr)
    }

    /// `https://127.0.0.1:PORT/discovery/<name>`: the issuer's discovery document where a
    /// `discoveryURL` finds it (the document names [`StandInIssuer::url`] as its issuer).
    pub fn discovery_url(&self, name: &str) -> String {
        format!("https://{}{ALTERNATE_DISCOVERY_PREFIX}{name}", self.addr)
    }

    /// Publishes `key` in the key set of `name` (replacing a key of the same kid).
    pub fn publish(&self, name: &str, key: &Key) {
        let mut state = self.lock();
        let keys = state
            .issuers
            .get_mut(name)
            .unwrap_or_else(|| panic!("no issuer {name:?}"));
        keys.retain(|k| k.kid != key.kid);
        keys.push(key.clone());
    }

    /// Withdraws the key `kid` from the key set of `name`.
    pub fn withdraw(&self, name: &str, kid: &str) {
        let mut state = self.lock();
        let keys = state
            .issuers
            .get_mut(name)
            .unwrap_or_else(|| panic!("no issuer {name:?}"));
        keys.retain(|k| k.kid != kid);
    }

    /// Requests received for `path` (without its query), whatever was answered.
    pub fn requests(&self, path: &str) -> usize {
        self.lock().requests.get(path).copied().unwrap_or(0)
    }

    /// Fetches of the key set of `name`.
    pub fn jwks_fetches(&self, name: &str) -> usize {
        self.requests(&format!("/{name}{JWKS_SUFFIX}"))
    }

    /// Fetches of the discovery document of `name`, at either of its paths.
    pub fn discovery_fetches(&self, name: &str) -> usize {
        self.requests(&format!("/{name}{DISCOVERY_SUFFIX}"))
            + self.requests(&format!("{ALTERNATE_DISCOVERY_PREFIX}{name}"))
    }

    /// Every path requested so far and how often.
    pub fn request_counts(&self) -> BTreeMap<String, usize> {
        self.lock().requests.clone()
    }
}

impl Drop for StandInIssuer {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

async fn serve(tcp: TcpStream, acceptor: TlsAcceptor, state: Arc<Mutex<State>>, addr: SocketAddr) {
    let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await else {
        return;
    };
    let service = service_fn(move |req: Request<Incoming>| {
        let state = Arc::clone(&state);
        async move { Ok::<_, Infallible>(answer(&req, &state, addr)) }
    });
    let _ = auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(tls), service)
        .await;
}

/// Which document a path asks for, and of which issuer.
enum Document<'a> {
    Discovery(&'a str),
    Jwks(&'a str),
}

fn route(path: &str) -> Option<Document<'_>> {
    if let Some(name) = path.strip_prefix(ALTERNATE_DISCOVERY_PREFIX) {
        return Some(Document::Discovery(name));
    }
    let rest = path.strip_prefix('/')?;
    if let Some(name) = rest.strip_suffix(DISCOVERY_SUFFIX) {
        return Some(Document::Discovery(name));
    }
    rest.strip_suffix(JWKS_SUFFIX).map(Document::Jwks)
}

fn answer(
    req: &Request<Incoming>,
    state: &Mutex<State>,
    addr: SocketAddr,
) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
    *state.requests.entry(path.to_owned()).or_default() += 1;
    if req.method() != Method::GET {
        return respond(StatusCode::METHOD_NOT_ALLOWED, &json!({}));
    }
    let document = route(path).and_then(|document| match document {
        Document::Discovery(name) => state.issuers.contains_key(name).then(|| {
            let url = format!("https://{addr}/{name}");
            json!({
                "issuer": url,
                "jwks_uri": format!("{url}{JWKS_SUFFIX}"),
                "response_types_supported": ["id_token"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256", "PS256", "ES256", "ES384"],
            })
        }),
        Document::Jwks(name) => state
            .issuers
            .get(name)
            .map(|keys| json!({"keys": keys.iter().map(Key::jwk).collect::<Vec<_>>()})),
    });
    match document {
        Some(document) => respond(StatusCode::OK, &document),
        None => respond(StatusCode::NOT_FOUND, &json!({"error": "not found"})),
    }
}

fn respond(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body).unwrap())))
        .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verify(key: &Key, token: &str) -> bool {
        use ring::signature::{
            ECDSA_P256_SHA256_FIXED, ECDSA_P384_SHA384_FIXED, RSA_PKCS1_2048_8192_SHA256,
            RSA_PKCS1_2048_8192_SHA512, RSA_PSS_2048_8192_SHA256, RSA_PSS_2048_8192_SHA384,
            UnparsedPublicKey,
        };
        let (input, signature) = token.rsplit_once('.').unwrap();
        let signature = URL_SAFE_NO_PAD.decode(signature).unwrap();
        let header: Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(input.split('.').next().unwrap())
                .unwrap(),
        )
        .unwrap();
        let jwk = key.jwk();
        let field = |name: &str| URL_SAFE_NO_PAD.decode(jwk[name].as_str().unwrap()).unwrap();
        match header["alg"].as_str().unwrap() {
            alg @ ("RS256" | "RS512" | "PS256" | "PS384") => {
                let params = match alg {
                    "RS256" => &RSA_PKCS1_2048_8192_SHA256,
                    "RS512" => &RSA_PKCS1_2048_8192_SHA512,
                    "PS256" => &RSA_PSS_2048_8192_SHA256,
                    _ => &RSA_PSS_2048_8192_SHA384,
                };
                RsaPublicKeyComponents {
                    n: field("n"),
                    e: field("e"),
                }
                .verify(params, input.as_bytes(), &signature)
                .is_ok()
            }
            alg => {
                let params = if alg == "ES256" {
                    &ECDSA_P256_SHA256_FIXED
                } else {
                    &ECDSA_P384_SHA384_FIXED
                };
                let mut point = vec![4];
                point.extend(field("x"));
                point.extend(field("y"));
                UnparsedPublicKey::new(params, point)
                    .verify(input.as_bytes(), &signature)
                    .is_ok()
            }
        }
    }

    #[test]
    fn tokens_verify_with_the_published_jwk_and_broken_ones_do_not() {
        let claims = json!({"iss": "https://example", "sub": "x"});
        let rsa = Key::rsa("r");
        let cases = [
            (rsa.clone(), rsa.header()),
            (rsa.clone(), json!({"alg": "RS512", "kid": "r"})),
            (rsa.clone(), json!({"alg": "PS256", "kid": "r"})),
            (rsa.clone(), json!({"alg": "PS384", "kid": "r"})),
            (Key::p256("p"), json!({"alg": "ES256", "kid": "p"})),
            (Key::p384("q"), json!({"alg": "ES384", "kid": "q"})),
        ];
        for (key, header) in cases {
            let token = key.sign(&header, &claims);
            assert!(verify(&key, &token), "{key:?} {header}");
            assert!(
                !verify(&key, &with_wrong_signature(&token)),
                "{key:?} {header}"
            );
        }
    }

    #[test]
    fn paths_name_documents_of_issuers() {
        assert!(matches!(
            route("/a/.well-known/openid-configuration"),
            Some(Document::Discovery("a"))
        ));
        assert!(matches!(
            route("/discovery/b"),
            Some(Document::Discovery("b"))
        ));
        assert!(matches!(route("/a/jwks"), Some(Document::Jwks("a"))));
        assert!(route("/a/other").is_none());
    }
}
