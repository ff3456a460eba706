//! A JWT issuer's key set read as kube-apiserver reads it (go-jose v2.6.3's `JSONWebKeySet`,
//! which go-oidc's remote key set decodes the `jwks_uri` document into), and the choice of key
//! for a token, as go-oidc makes it.
//!
//! go-jose reads every key or refuses the whole set: a key of an unknown type or curve, a
//! missing or undecodable member, EC coordinates of the wrong size, an `x5c` chain that does not
//! parse or holds another public key, an `x5t` thumbprint that does not match, each makes the
//! set unusable (the fetch fails, the keys held are kept). It does not look at `use`, `alg` or
//! `key_ops`: an RSA key published for encryption verifies signatures all the same. Keys it reads
//! but that are never verified with here are kept apart ([`SkippedKey`]), so a token naming one
//! is refused for its algorithm rather than sent to fetch the set again.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_NIST_EC_P521,
    OID_PKCS1_RSAENCRYPTION, OID_SIG_ED25519,
};
use x509_parser::prelude::FromDer;

use super::KeyRefusal;
use crate::authn::jwt::{
    Algorithm, GO_RAW_URL, PublicKey, RSA_MODULUS_BITS, bit_length, without_leading_zeros,
};

/// A key set as fetched: the keys tokens are verified with here, and those go-jose reads but
/// tokens are never verified with here.
#[derive(Debug, Default)]
pub(crate) struct KeySet {
    /// The keys tokens are verified with.
    pub(crate) keys: Vec<PublicKey>,
    /// The others.
    pub(crate) skipped: Vec<SkippedKey>,
}

/// A key of the issuer's set that tokens are never verified with here, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedKey {
    /// Its key id (empty when it has none).
    pub kid: String,
    /// Why.
    pub why: Unusable,
}

/// Why a key go-jose reads is never verified with here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unusable {
    /// An EC key on P-521, for ES512: `ring` cannot verify it (kube-apiserver does).
    P521,
    /// An RSA key whose modulus has this many bits, outside the 2048 to 8192 `ring` verifies
    /// with (kube-apiserver, built with Go 1.24 or later, verifies from 1024 bits).
    RsaSize(usize),
    /// An RSA key whose public exponent `ring` refuses (it wants an odd one from 3 to 2^33 - 1).
    RsaExponent,
    /// A symmetric (`oct`) key: only HMAC algorithms use one, and kube-apiserver allows none.
    Symmetric,
    /// An Ed25519 (`OKP`) key: EdDSA, which kube-apiserver does not allow.
    Ed25519,
    /// A private key (`d` published): go-jose reads it but verifies nothing with it.
    Private,
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unusable::P521 => f.write_str("EC P-521 (ES512) cannot be verified here"),
            Unusable::RsaSize(bits) => write!(
                f,
                "RSA {bits}-bit: only {} to {} bits can be verified here",
                RSA_MODULUS_BITS.start(),
                RSA_MODULUS_BITS.end()
            ),
            Unusable::RsaExponent => f.write_str(
                "RSA public exponent not usable here (an odd one from 3 to 2^33 - 1 is)",
            ),
            Unusable::Symmetric => f.write_str("symmetric (oct) key: no algorithm allowed uses it"),
            Unusable::Ed25519 => f.write_str("Ed25519 (OKP) key: EdDSA is not allowed"),
            Unusable::Private => f.write_str("private key: nothing is verified with it"),
        }
    }
}

impl SkippedKey {
    /// Whether a token signed with `algorithm` may have been made with this key.
    fn could_sign(&self, algorithm: Algorithm) -> bool {
        match self.why {
            Unusable::RsaSize(_) | Unusable::RsaExponent => algorithm.is_rsa(),
            Unusable::P521 | Unusable::Symmetric | Unusable::Ed25519 | Unusable::Private => false,
        }
    }
}

/// A key set document go-jose would refuse.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    /// Not a JSON object of the JWKS's shape.
    #[error("not a JSON Web Key Set: {0}")]
    Json(#[source] serde_json::Error),
    /// A key is not one go-jose reads, which makes it refuse the whole set.
    #[error("key {index} (kid {kid:?}): {why}")]
    Key {
        /// Its place in `keys`, from 0.
        index: usize,
        /// Its key id.
        kid: String,
        /// What is wrong with it.
        #[source]
        why: BadKey,
    },
}

/// What is wrong with a key go-jose refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadKey {
    /// `kty` is none of EC, RSA, oct, OKP.
    #[error("unknown key type {0:?}")]
    Type(String),
    /// `crv` is not a curve go-jose knows for the key type.
    #[error("unsupported curve {0:?}")]
    Curve(String),
    /// A member the key type needs is missing.
    #[error("missing {0}")]
    Missing(&'static str),
    /// A member is not base64url (or, for `x5c`, base64).
    #[error("{0} is not valid base64")]
    Base64(&'static str),
    /// An EC coordinate is not the curve's size.
    #[error("{member} is {have} bytes, the curve's coordinates are {want}")]
    Length {
        /// `x` or `y`.
        member: &'static str,
        /// Its size.
        have: usize,
        /// The curve's.
        want: usize,
    },
    /// An `x5c` entry is not a DER certificate.
    #[error("x5c entry {0} is not a certificate")]
    Certificate(usize),
    /// The first `x5c` certificate's public key is not the key's.
    #[error("the public keys of the key and of its x5c certificate differ")]
    CertificateMismatch,
    /// A symmetric key comes with a certificate chain.
    #[error("a symmetric key with a certificate chain")]
    SymmetricWithCertificate,
    /// An `x5t` or `x5t#S256` thumbprint of the wrong size, or not the certificate's.
    #[error("{0} is not the thumbprint of the x5c certificate")]
    Thumbprint(&'static str),
}

/// The members of a JWK go-jose reads. A member of the wrong JSON type fails the set, as in
/// Go's `encoding/json`; `null` is as if absent.
#[derive(Deserialize)]
struct RawKey {
    #[serde(default)]
    kty: Option<String>,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    /// Read only so that a non-string one fails the set as in go-jose: neither `use` nor `alg`
    /// decides anything there.
    #[serde(default, rename = "use")]
    _use: Option<String>,
    #[serde(default, rename = "alg")]
    _alg: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
    #[serde(default)]
    d: Option<String>,
    #[serde(default)]
    k: Option<String>,
    #[serde(default)]
    x5c: Option<Vec<String>>,
    #[serde(default)]
    x5t: Option<String>,
    #[serde(default, rename = "x5t#S256")]
    x5t_s256: Option<String>,
}

/// The document: Go reads `null` as an empty set; each key must be an object (a derived struct
/// would also take an array).
#[derive(Deserialize)]
struct RawSet {
    #[serde(default)]
    keys: Option<Vec<serde_json::Map<String, serde_json::Value>>>,
}

/// A key's public half, to compare with its certificate's as go-jose does.
#[derive(Debug, PartialEq, Eq)]
enum Public {
    Rsa { n: Vec<u8>, e: Vec<u8> },
    Ec { curve: &'static str, point: Vec<u8> },
    Ed25519(Vec<u8>),
    None,
}

/// A key go-jose reads: usable here, or skipped.
enum Read {
    Usable(PublicKey),
    Skipped(Unusable),
}

/// Reads a key set document as go-jose does (see the module).
pub(crate) fn parse(document: &[u8]) -> Result<KeySet, JwksError> {
    let raw = match serde_json::from_slice(document).map_err(JwksError::Json)? {
        serde_json::Value::Null => return Ok(KeySet::default()),
        object @ serde_json::Value::Object(_) => {
            serde_json::from_value::<RawSet>(object).map_err(JwksError::Json)?
        }
        other => {
            return Err(JwksError::Json(serde::de::Error::custom(format_args!(
                "expected an object, found {}",
                kind(&other)
            ))));
        }
    };
    let mut set = KeySet::default();
    for (index, key) in raw.keys.unwrap_or_default().into_iter().enumerate() {
        let key: RawKey = serde_json::from_value(key.into()).map_err(JwksError::Json)?;
        let kid = key.kid.clone().unwrap_or_default();
        match read_key(&key) {
            Ok(Read::Usable(public)) => set.keys.push(public),
            Ok(Read::Skipped(why)) => set.skipped.push(SkippedKey { kid, why }),
            Err(why) => return Err(JwksError::Key { index, kid, why }),
        }
    }
    Ok(set)
}

/// What a JSON value is, for errors.
fn kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// go-jose's `base64URLDecode`: trailing `=` trimmed, then Go's `RawURLEncoding`, which skips
/// line breaks and ignores the unused bits of the last character.
fn go_jose_bytes(value: &str, member: &'static str) -> Result<Vec<u8>, BadKey> {
    let trimmed: String = value
        .trim_end_matches('=')
        .chars()
        .filter(|c| !matches!(c, '\r' | '\n'))
        .collect();
    GO_RAW_URL
        .decode(trimmed)
        .map_err(|_| BadKey::Base64(member))
}

/// A member the key type needs, decoded.
fn needed(value: &Option<String>, member: &'static str) -> Result<Vec<u8>, BadKey> {
    go_jose_bytes(value.as_deref().ok_or(BadKey::Missing(member))?, member)
}

fn read_key(key: &RawKey) -> Result<Read, BadKey> {
    let kid = key.kid.clone().unwrap_or_default();
    let certificates = certificates(key.x5c.as_deref().unwrap_or_default())?;
    let private = match &key.d {
        Some(d) => {
            go_jose_bytes(d, "d")?;
            true
        }
        None => false,
    };
    let (read, public) = match key.kty.as_deref().unwrap_or_default() {
        "EC" => {
            let (curve, size) = match key.crv.as_deref().unwrap_or_default() {
                "P-256" => ("P-256", 32),
                "P-384" => ("P-384", 48),
                "P-521" => ("P-521", 66),
                other => return Err(BadKey::Curve(other.to_owned())),
            };
            let (x, y) = (needed(&key.x, "x")?, needed(&key.y, "y")?);
            for (member, coordinate) in [("x", &x), ("y", &y)] {
                if coordinate.len() != size {
                    return Err(BadKey::Length {
                        member,
                        have: coordinate.len(),
                        want: size,
                    });
                }
            }
            let algorithm = match curve {
                "P-256" => Some(Algorithm::Es256),
                "P-384" => Some(Algorithm::Es384),
                _ => None,
            };
            let read = match algorithm.and_then(|a| PublicKey::ec(kid.clone(), a, &x, &y)) {
                Some(public) => Read::Usable(public),
                None => Read::Skipped(Unusable::P521),
            };
            let mut point = vec![0x04];
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            (read, Public::Ec { curve, point })
        }
        "RSA" => {
            let (n, e) = (needed(&key.n, "n")?, needed(&key.e, "e")?);
            let public = PublicKey::rsa(kid.clone(), &n, &e);
            let (n, e) = (
                without_leading_zeros(&n).to_vec(),
                without_leading_zeros(&e).to_vec(),
            );
            let bits = bit_length(&n);
            let read = if !RSA_MODULUS_BITS.contains(&bits) {
                Read::Skipped(Unusable::RsaSize(bits))
            } else if !ring_exponent(&e) {
                Read::Skipped(Unusable::RsaExponent)
            } else {
                Read::Usable(public)
            };
            (read, Public::Rsa { n, e })
        }
        "oct" => {
            if !certificates.is_empty() {
                return Err(BadKey::SymmetricWithCertificate);
            }
            needed(&key.k, "k")?;
            (Read::Skipped(Unusable::Symmetric), Public::None)
        }
        "OKP" => {
            let crv = key.crv.as_deref().unwrap_or_default();
            let Some(x) = key.x.as_deref().filter(|_| crv == "Ed25519") else {
                return Err(BadKey::Curve(crv.to_owned()));
            };
            // go-jose copies x into a 32-byte key, whatever its size.
            let mut point = go_jose_bytes(x, "x")?;
            point.resize(32, 0);
            (Read::Skipped(Unusable::Ed25519), Public::Ed25519(point))
        }
        other => return Err(BadKey::Type(other.to_owned())),
    };
    if let Some(leaf) = certificates.first()
        && public != certificate_public(leaf)
    {
        return Err(BadKey::CertificateMismatch);
    }
    thumbprint(
        key.x5t.as_deref(),
        "x5t",
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        &certificates,
    )?;
    thumbprint(
        key.x5t_s256.as_deref(),
        "x5t#S256",
        &ring::digest::SHA256,
        &certificates,
    )?;
    Ok(if private {
        Read::Skipped(Unusable::Private)
    } else {
        read
    })
}

/// Whether `ring` verifies with this public exponent (without leading zeros): odd, from 3 to 2^33 - 1.
fn ring_exponent(e: &[u8]) -> bool {
    if e.len() > 5 {
        return false;
    }
    let value = e.iter().fold(0u64, |v, &b| (v << 8) | u64::from(b));
    (3..(1 << 33)).contains(&value) && value % 2 == 1
}

/// The `x5c` chain: Go's standard base64 (line breaks skipped) of DER certificates, each of
/// which must parse whole.
fn certificates(x5c: &[String]) -> Result<Vec<Vec<u8>>, BadKey> {
    x5c.iter()
        .enumerate()
        .map(|(i, entry)| {
            let cleaned: String = entry
                .chars()
                .filter(|c| !matches!(c, '\r' | '\n'))
                .collect();
            let der = STANDARD
                .decode(cleaned)
                .map_err(|_| BadKey::Base64("x5c"))?;
            match x509_parser::certificate::X509Certificate::from_der(&der) {
                Ok(([], _)) => Ok(der),
                _ => Err(BadKey::Certificate(i)),
            }
        })
        .collect()
}

/// The public key of a DER certificate already parsed once by [`certificates`].
fn certificate_public(der: &[u8]) -> Public {
    let Ok((_, certificate)) = x509_parser::certificate::X509Certificate::from_der(der) else {
        return Public::None;
    };
    let spki = certificate.public_key();
    let algorithm = &spki.algorithm.algorithm;
    let key = spki.subject_public_key.data.to_vec();
    if *algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok());
        let curve = match curve {
            Some(c) if c == OID_EC_P256 => "P-256",
            Some(c) if c == OID_NIST_EC_P384 => "P-384",
            Some(c) if c == OID_NIST_EC_P521 => "P-521",
            _ => return Public::None,
        };
        return Public::Ec { curve, point: key };
    }
    if *algorithm == OID_SIG_ED25519 {
        return Public::Ed25519(key);
    }
    if *algorithm == OID_PKCS1_RSAENCRYPTION
        && let Ok(x509_parser::public_key::PublicKey::RSA(rsa)) = spki.parsed()
    {
        return Public::Rsa {
            n: without_leading_zeros(rsa.modulus).to_vec(),
            e: without_leading_zeros(rsa.exponent).to_vec(),
        };
    }
    Public::None
}

/// Checks an `x5t`/`x5t#S256` as go-jose: base64url without padding (hex inside when twice the
/// digest's size), the digest's size, and the leaf certificate's digest when there is one.
fn thumbprint(
    value: Option<&str>,
    member: &'static str,
    digest: &'static ring::digest::Algorithm,
    certificates: &[Vec<u8>],
) -> Result<(), BadKey> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(());
    };
    let cleaned: String = value
        .chars()
        .filter(|c| !matches!(c, '\r' | '\n'))
        .collect();
    let mut bytes = GO_RAW_URL
        .decode(cleaned)
        .map_err(|_| BadKey::Base64(member))?;
    let size = digest.output_len();
    if bytes.len() == 2 * size {
        bytes = from_hex(&bytes).ok_or(BadKey::Thumbprint(member))?;
    }
    if bytes.len() != size {
        return Err(BadKey::Thumbprint(member));
    }
    match certificates.first() {
        Some(leaf) if ring::digest::digest(digest, leaf).as_ref() != bytes.as_slice() => {
            Err(BadKey::Thumbprint(member))
        }
        _ => Ok(()),
    }
}

/// Hex text (either case) as bytes.
fn from_hex(text: &[u8]) -> Option<Vec<u8>> {
    let digit = |c: u8| (c as char).to_digit(16);
    text.chunks(2)
        .map(|pair| u8::try_from(digit(pair[0])? * 16 + digit(*pair.get(1)?)?).ok())
        .collect()
}

/// What the keys say of a token, before any fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    /// A key it may have been made with verifies it.
    Verified,
    /// Refused.
    Refused(KeyRefusal),
    /// No key of the set may have made it: a newer set may hold one.
    Unknown,
}

impl KeySet {
    /// Verifies a signature as go-oidc's remote key set: with the keys of the token's `kid`, or
    /// every key when it names none, of those that fit `algorithm`. A `kid` the set holds only
    /// keys of another kind for (or only keys skipped here) is refused for its algorithm; a `kid`
    /// the set lacks, or no key at all for a token naming none, is [`Choice::Unknown`].
    pub(crate) fn choose(
        &self,
        algorithm: Algorithm,
        kid: &str,
        signing_input: &[u8],
        signature: &[u8],
    ) -> Choice {
        let named = |key_id: &str| kid.is_empty() || key_id == kid;
        let mut candidates = self
            .keys
            .iter()
            .filter(|key| named(&key.kid) && key.fits(algorithm))
            .peekable();
        if candidates.peek().is_none() {
            let known = if kid.is_empty() {
                self.skipped.iter().any(|key| key.could_sign(algorithm))
            } else {
                self.keys.iter().any(|key| key.kid == kid)
                    || self.skipped.iter().any(|key| key.kid == kid)
            };
            return if known {
                Choice::Refused(KeyRefusal::Algorithm)
            } else {
                Choice::Unknown
            };
        }
        if candidates.any(|key| key.verify(algorithm, signing_input, signature)) {
            Choice::Verified
        } else {
            Choice::Refused(KeyRefusal::Signature)
        }
    }
}
