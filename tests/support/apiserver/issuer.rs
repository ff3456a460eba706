//! The stand-in's service-account issuer, as kube-apiserver publishes it: the discovery document
//! (`/.well-known/openid-configuration`) naming the issuer, the JWKS (`/openid/v1/jwks`) with its
//! public keys, and tokens signed (ES256) with the current key, for the tests to present. Keys
//! rotate on demand; what was fetched is counted.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde_json::{Value, json};

/// The issuer the stand-in publishes, kube-apiserver's usual one.
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// Where the discovery document is served.
pub const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";
/// Where the keys are served.
pub const JWKS_PATH: &str = "/openid/v1/jwks";
/// The one representation of the keys kube-apiserver serves (406 for any other `Accept`).
pub const JWKS_MEDIA_TYPE: &str = "application/jwk-set+json";

/// A signing key and the id it is published under.
struct SigningKey {
    kid: String,
    pair: EcdsaKeyPair,
}

impl SigningKey {
    fn generate(kid: String) -> SigningKey {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        SigningKey { kid, pair }
    }

    fn jwk(&self) -> Value {
        let point = self.pair.public_key().as_ref();
        json!({
            "use": "sig", "kty": "EC", "crv": "P-256", "alg": "ES256", "kid": self.kid,
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..]),
        })
    }
}

/// The issuer's keys (the last one signs) and what was asked of it.
pub(super) struct Issuer {
    keys: Vec<SigningKey>,
    generation: usize,
    /// Whether discovery answers 403, as for a caller not bound to
    /// `system:service-account-issuer-discovery`.
    pub(super) forbidden: bool,
    /// GETs of the discovery document and of the keys.
    pub(super) discovery_fetches: usize,
    pub(super) jwks_fetches: usize,
}

impl Default for Issuer {
    fn default() -> Issuer {
        Issuer {
            keys: vec![SigningKey::generate("stand-in-key-1".into())],
            generation: 1,
            forbidden: false,
            discovery_fetches: 0,
            jwks_fetches: 0,
        }
    }
}

impl Issuer {
    /// The discovery document.
    pub(super) fn discovery(&self, server: &str) -> Value {
        json!({
            "issuer": ISSUER,
            "jwks_uri": format!("{server}{JWKS_PATH}"),
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
        })
    }

    /// The JWKS: every key, the retired ones included (they still verify what they signed).
    pub(super) fn jwks(&self) -> Value {
        json!({ "keys": self.keys.iter().map(SigningKey::jwk).collect::<Vec<_>>() })
    }

    /// A new key signs from now on; with `retire`, the old ones are withdrawn.
    pub(super) fn rotate(&mut self, retire: bool) {
        self.generation += 1;
        let key = SigningKey::generate(format!("stand-in-key-{}", self.generation));
        if retire {
            self.keys.clear();
        }
        self.keys.push(key);
    }

    /// `claims` signed with the current key, named by its id (or by `kid`).
    pub(super) fn sign(&self, claims: &Value, kid: Option<&str>) -> String {
        let key = self.keys.last().unwrap();
        let header = json!({"alg": "ES256", "kid": kid.unwrap_or(&key.kid)});
        let encode = |value: &Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).unwrap());
        let input = format!("{}.{}", encode(&header), encode(claims));
        let signature = key
            .pair
            .sign(&SystemRandom::new(), input.as_bytes())
            .unwrap();
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature.as_ref()))
    }
}

/// The claims of a service-account token for `namespace/name`, issued now, valid an hour, for
/// the issuer's audience: what `kubectl create token` gets.
pub fn service_account_claims(namespace: &str, name: &str) -> Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    json!({
        "iss": ISSUER,
        "aud": [ISSUER],
        "sub": format!("system:serviceaccount:{namespace}:{name}"),
        "iat": now, "nbf": now, "exp": now + 3600,
        "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": name, "uid": "0000"}},
    })
}
