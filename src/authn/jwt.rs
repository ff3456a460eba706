//! Service-account JWTs checked on the node, so that a forged one costs the API server nothing.
//!
//! A bearer token that is a compact JWS naming one of the cluster's service-account issuers is
//! checked against the issuer's published public keys (JWKS) and its claims (`exp`, `nbf`, `iat`
//! with kube-apiserver's minute of leeway, and `aud`). What fails is refused without a
//! TokenReview; what passes still goes to TokenReview, because only the API server knows whether
//! the pod or secret the token is bound to still exists. Nothing here ever accepts a token.
//!
//! Signatures are verified with `ring` (already the TLS provider): for service-account tokens
//! RS256 and ES256/ES384, the algorithms kube-apiserver signs them with (a token of another
//! algorithm is left to TokenReview); [`PublicKey`] and [`Algorithm`] also serve the keys of
//! `--authentication-config`'s JWT issuers ([`super::structured::keys`]), which may sign with any
//! of kube-apiserver's allowlist but ES512.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::alphabet::URL_SAFE;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, Visitor};

/// kube-apiserver's leeway on `exp`, `nbf` and `iat` (go-jose's `DefaultLeeway`).
pub const LEEWAY: Duration = Duration::from_secs(60);

/// Go's `base64.RawURLEncoding`, which kube-apiserver decodes a token's parts with: no padding,
/// and the unused low bits of the last character ignored rather than refused. A token whose
/// parts are spelled with such bits set is, for the API server, the same token; judging it so
/// here keeps a forgery spelled that way from reaching TokenReview, and a real token spelled
/// that way from being refused on the node.
pub(crate) const GO_RAW_URL: GeneralPurpose = GeneralPurpose::new(
    &URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(true),
);

/// A signature algorithm verified here: every one of kube-apiserver's allowlist for JWT
/// authenticators (`oidc.AllValidSigningAlgorithms`) but ES512, which `ring` cannot verify (no
/// P-521).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    Rs256,
    /// RSASSA-PKCS1-v1_5 with SHA-384.
    Rs384,
    /// RSASSA-PKCS1-v1_5 with SHA-512.
    Rs512,
    /// RSASSA-PSS with SHA-256 (salt as long as the hash, as RFC 7518 says).
    Ps256,
    /// RSASSA-PSS with SHA-384.
    Ps384,
    /// RSASSA-PSS with SHA-512.
    Ps512,
    /// ECDSA on P-256 with SHA-256.
    Es256,
    /// ECDSA on P-384 with SHA-384.
    Es384,
}

impl Algorithm {
    /// The algorithms kube-apiserver signs service-account tokens with, the only ones
    /// [`classify`] verifies: a service-account token of another is left to TokenReview.
    fn from_name(name: &str) -> Option<Algorithm> {
        match name {
            "RS256" => Some(Algorithm::Rs256),
            "ES256" => Some(Algorithm::Es256),
            "ES384" => Some(Algorithm::Es384),
            _ => None,
        }
    }

    /// The algorithm a JWS header's `alg` names, if verified here. `ES512` and every name outside
    /// kube-apiserver's allowlist (`none`, `HS256`, `EdDSA`...) are `None`.
    pub fn from_jws_name(name: &str) -> Option<Algorithm> {
        Some(match name {
            "RS256" => Algorithm::Rs256,
            "RS384" => Algorithm::Rs384,
            "RS512" => Algorithm::Rs512,
            "PS256" => Algorithm::Ps256,
            "PS384" => Algorithm::Ps384,
            "PS512" => Algorithm::Ps512,
            "ES256" => Algorithm::Es256,
            "ES384" => Algorithm::Es384,
            _ => return None,
        })
    }

    /// Whether RSA keys sign with it (the RS and PS algorithms).
    pub fn is_rsa(self) -> bool {
        !matches!(self, Algorithm::Es256 | Algorithm::Es384)
    }
}

/// A public key of the issuer's JWKS, ready to verify with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    /// The key id (`kid`) tokens name it by; empty when the JWKS gave none.
    pub kid: String,
    key: KeyMaterial,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyMaterial {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// The uncompressed point (`0x04 || x || y`) and the curve's algorithm.
    Ec {
        algorithm: Algorithm,
        point: Vec<u8>,
    },
}

/// The RSA moduli `ring` verifies with, in bits.
pub const RSA_MODULUS_BITS: std::ops::RangeInclusive<usize> = 2048..=8192;

impl PublicKey {
    /// An RSA key of modulus `n` and exponent `e` (big-endian; leading zero bytes, which some
    /// publishers write and Go's `big.Int` ignores, are dropped: `ring` wants none). Whether
    /// `ring` can verify with it ([`RSA_MODULUS_BITS`], an odd `e` from 3 to 2^33 - 1) is found
    /// when verifying: a key it refuses verifies nothing.
    pub fn rsa(kid: String, n: &[u8], e: &[u8]) -> PublicKey {
        PublicKey {
            kid,
            key: KeyMaterial::Rsa {
                n: without_leading_zeros(n).to_vec(),
                e: without_leading_zeros(e).to_vec(),
            },
        }
    }

    /// An EC key for `algorithm` (ES256: P-256, ES384: P-384) at the point (`x`, `y`); `None`
    /// unless `algorithm` is one of those and each coordinate is exactly the curve's size.
    pub fn ec(kid: String, algorithm: Algorithm, x: &[u8], y: &[u8]) -> Option<PublicKey> {
        let size = match algorithm {
            Algorithm::Es256 => 32,
            Algorithm::Es384 => 48,
            _ => return None,
        };
        if x.len() != size || y.len() != size {
            return None;
        }
        let mut point = Vec::with_capacity(1 + 2 * size);
        point.push(0x04);
        point.extend_from_slice(x);
        point.extend_from_slice(y);
        Some(PublicKey {
            kid,
            key: KeyMaterial::Ec { algorithm, point },
        })
    }

    /// What kind of key it is, for reports: `RSA 2048-bit`, `EC P-256`, `EC P-384`.
    pub fn kind(&self) -> String {
        match &self.key {
            KeyMaterial::Rsa { n, .. } => format!("RSA {}-bit", bit_length(n)),
            KeyMaterial::Ec {
                algorithm: Algorithm::Es256,
                ..
            } => "EC P-256".to_owned(),
            KeyMaterial::Ec { .. } => "EC P-384".to_owned(),
        }
    }

    /// Whether a token signed with `algorithm` may have been signed with this key: an RSA key
    /// for the RS and PS algorithms, an EC key for its curve's.
    pub(crate) fn fits(&self, algorithm: Algorithm) -> bool {
        match &self.key {
            KeyMaterial::Rsa { .. } => algorithm.is_rsa(),
            KeyMaterial::Ec { algorithm: a, .. } => *a == algorithm,
        }
    }

    /// Whether `signature` is this key's over `message` with `algorithm`.
    pub(crate) fn verify(&self, algorithm: Algorithm, message: &[u8], signature: &[u8]) -> bool {
        use ring::signature;
        match &self.key {
            KeyMaterial::Rsa { n, e } => {
                let parameters: &signature::RsaParameters = match algorithm {
                    Algorithm::Rs256 => &signature::RSA_PKCS1_2048_8192_SHA256,
                    Algorithm::Rs384 => &signature::RSA_PKCS1_2048_8192_SHA384,
                    Algorithm::Rs512 => &signature::RSA_PKCS1_2048_8192_SHA512,
                    Algorithm::Ps256 => &signature::RSA_PSS_2048_8192_SHA256,
                    Algorithm::Ps384 => &signature::RSA_PSS_2048_8192_SHA384,
                    Algorithm::Ps512 => &signature::RSA_PSS_2048_8192_SHA512,
                    Algorithm::Es256 | Algorithm::Es384 => return false,
                };
                signature::RsaPublicKeyComponents {
                    n: n.as_slice(),
                    e: e.as_slice(),
                }
                .verify(parameters, message, signature)
                .is_ok()
            }
            KeyMaterial::Ec {
                algorithm: a,
                point,
            } if *a == algorithm => {
                let verification = if algorithm == Algorithm::Es256 {
                    &signature::ECDSA_P256_SHA256_FIXED
                } else {
                    &signature::ECDSA_P384_SHA384_FIXED
                };
                signature::UnparsedPublicKey::new(verification, point)
                    .verify(message, signature)
                    .is_ok()
            }
            KeyMaterial::Ec { .. } => false,
        }
    }
}

/// A big-endian number without its leading zero bytes.
pub fn without_leading_zeros(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len());
    &bytes[start..]
}

/// The bit length of a big-endian number.
pub fn bit_length(bytes: &[u8]) -> usize {
    match without_leading_zeros(bytes) {
        [] => 0,
        number @ [first, ..] => number.len() * 8 - first.leading_zeros() as usize,
    }
}

/// A JWKS document that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    /// Not a JWKS.
    #[error("not a JSON Web Key Set: {0}")]
    Json(#[from] serde_json::Error),
    /// No key this module can verify with.
    #[error("the key set holds no RSA, P-256 or P-384 signing key")]
    NoUsableKey,
}

#[derive(Deserialize)]
struct JwksDocument {
    keys: Vec<Jwk>,
}

#[derive(Deserialize)]
struct Jwk {
    kty: String,
    #[serde(default)]
    kid: String,
    #[serde(default, rename = "use")]
    use_: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

/// The usable signing keys of a JWKS, and whether it published others.
#[derive(Debug)]
pub struct Jwks {
    /// The keys tokens can be verified with here.
    pub keys: Vec<PublicKey>,
    /// Whether every key of the document is among `keys`: then a token signed with an algorithm
    /// none of them fits cannot be the issuer's.
    pub complete: bool,
}

/// The signing keys of a JWKS (`/openid/v1/jwks`). Keys of other types or curves, keys for
/// encryption, and keys that do not decode are skipped (the set is then not `complete`): a token
/// naming one goes to TokenReview.
pub fn parse_jwks(document: &[u8]) -> Result<Jwks, JwksError> {
    let document: JwksDocument = serde_json::from_slice(document)?;
    let published = document.keys.len();
    let decode = |field: &Option<String>| {
        field
            .as_deref()
            .and_then(|value| URL_SAFE_NO_PAD.decode(value).ok())
    };
    let keys: Vec<PublicKey> = document
        .keys
        .into_iter()
        .filter(|jwk| jwk.use_.as_deref().is_none_or(|u| u == "sig"))
        .filter_map(|jwk| match (jwk.kty.as_str(), jwk.crv.as_deref()) {
            ("RSA", _) => Some(PublicKey::rsa(jwk.kid, &decode(&jwk.n)?, &decode(&jwk.e)?)),
            ("EC", Some("P-256")) => PublicKey::ec(
                jwk.kid,
                Algorithm::Es256,
                &decode(&jwk.x)?,
                &decode(&jwk.y)?,
            ),
            ("EC", Some("P-384")) => PublicKey::ec(
                jwk.kid,
                Algorithm::Es384,
                &decode(&jwk.x)?,
                &decode(&jwk.y)?,
            ),
            _ => None,
        })
        .collect();
    if keys.is_empty() {
        return Err(JwksError::NoUsableKey);
    }
    Ok(Jwks {
        complete: keys.len() == published,
        keys,
    })
}

/// Why a token of a known issuer was refused on the node: a metrics label and a log reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Claims or encoding that cannot be a token the issuer signed.
    Malformed,
    /// No published key has the token's key id, though the keys were fetched after it was issued.
    UnknownKey,
    /// The signature does not verify with the key the token names.
    Signature,
    /// Past `exp` (with the leeway).
    Expired,
    /// Before `nbf`, or issued (`iat`) in the future (with the leeway).
    NotYetValid,
    /// None of the token's audiences is one the proxy accepts.
    Audience,
    /// Signed with an algorithm none of the issuer's published keys is for.
    Algorithm,
}

impl Rejection {
    /// Every rejection, so each one's counter exists at 0 from the start.
    pub const ALL: [Rejection; 7] = [
        Rejection::Malformed,
        Rejection::UnknownKey,
        Rejection::Signature,
        Rejection::Expired,
        Rejection::NotYetValid,
        Rejection::Audience,
        Rejection::Algorithm,
    ];

    /// The metrics label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Malformed => "malformed",
            Rejection::UnknownKey => "unknown_key",
            Rejection::Signature => "signature",
            Rejection::Expired => "expired",
            Rejection::NotYetValid => "not_yet_valid",
            Rejection::Audience => "audience",
            Rejection::Algorithm => "algorithm",
        }
    }

    /// What the log says (never the token).
    pub fn reason(self) -> &'static str {
        match self {
            Rejection::Malformed => "service-account token malformed",
            Rejection::UnknownKey => "service-account token signed with an unknown key",
            Rejection::Signature => "service-account token signature invalid",
            Rejection::Expired => "service-account token expired",
            Rejection::NotYetValid => "service-account token not valid yet",
            Rejection::Audience => "service-account token for another audience",
            Rejection::Algorithm => {
                "service-account token signed with an algorithm the issuer does not use"
            }
        }
    }
}

/// A token parsed as a JWS of a known issuer, its signature not yet checked.
#[derive(Debug)]
pub struct Parsed<'a> {
    algorithm: Algorithm,
    kid: String,
    signing_input: Cow<'a, [u8]>,
    signature: Vec<u8>,
    claims: Claims,
}

impl Parsed<'_> {
    /// When the token was issued (`iat`), if it says.
    pub fn issued_at(&self) -> Option<SystemTime> {
        self.claims.iat.map(unix)
    }

    /// The key id the token names (empty when none).
    pub fn kid(&self) -> &str {
        &self.kid
    }
}

/// What a token is, before any key is looked at.
#[derive(Debug)]
pub enum Shape<'a> {
    /// Not a JWS of a known issuer signed with an algorithm checked here: TokenReview decides.
    Other,
    /// A JWS of a known issuer whose claims already refuse it.
    Refused(Rejection),
    /// A JWS of a known issuer, within its claims, signed with an algorithm not verified here:
    /// refused if the issuer publishes no key it could be for, else TokenReview decides.
    OtherAlgorithm,
    /// A JWS of a known issuer to check against its keys.
    ServiceAccount(Parsed<'a>),
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: String,
}

#[derive(Debug, Deserialize)]
struct Claims {
    #[serde(default)]
    aud: Option<Audiences>,
    #[serde(default)]
    exp: Option<f64>,
    #[serde(default)]
    nbf: Option<f64>,
    #[serde(default)]
    iat: Option<f64>,
}

/// `aud`: one string or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Audiences {
    One(String),
    Many(Vec<String>),
}

fn unix(seconds: f64) -> SystemTime {
    if seconds <= 0.0 || !seconds.is_finite() {
        return UNIX_EPOCH;
    }
    UNIX_EPOCH + Duration::from_secs_f64(seconds.min(1e12))
}

/// The issuer a JWT's decoded payload names, read as kube-apiserver's `hasCorrectIssuer` reads it
/// (Go's `encoding/json` into a struct whose one field is `iss`): keys match `iss` ignoring case
/// with Unicode simple folding (`ſ` is an `s`), the last match wins, `null` names none, and a
/// payload that is not a JSON object, or whose matching value is neither a string nor `null`,
/// names no issuer. Bytes that are not UTF-8 are read as U+FFFD, as Go does.
pub(crate) fn issuer(payload: &[u8]) -> Option<String> {
    struct Issuer;
    impl<'de> Visitor<'de> for Issuer {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<String>, A::Error> {
            let mut issuer = None;
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                if names_iss(&key) {
                    if let Some(value) = map.next_value::<Option<String>>()? {
                        issuer = Some(value);
                    }
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(issuer)
        }
    }
    impl<'de> de::DeserializeSeed<'de> for Issuer {
        type Value = Option<String>;
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
            d.deserialize_map(self)
        }
    }
    let text = String::from_utf8_lossy(payload);
    let mut json = serde_json::Deserializer::from_str(&text);
    let issuer = de::DeserializeSeed::deserialize(Issuer, &mut json).ok()?;
    json.end().ok()?;
    issuer
}

/// Whether a JSON key is `iss` for Go's `encoding/json`, which matches field names with
/// `bytes.EqualFold`: each of `i`, `s`, `s` in either case, and `ſ` (U+017F) for an `s`.
fn names_iss(key: &str) -> bool {
    let mut chars = key.chars();
    let s = |c: Option<char>| matches!(c, Some('s' | 'S' | '\u{17f}'));
    matches!(chars.next(), Some('i' | 'I'))
        && s(chars.next())
        && s(chars.next())
        && chars.next().is_none()
}

/// Reads `token` as a JWS: `Other` unless it names one of `issuers` with an algorithm verified
/// here; then its time and audience claims against `now` and `audiences` (a token for none of
/// them is refused; an empty `audiences` accepts any). Whether it names an issuer is decided as
/// kube-apiserver decides it ([`issuer`], [`GO_RAW_URL`]), at any size the request's headers
/// carry, so that no spelling of a token the API server would judge as the issuer's escapes
/// the judgement here.
pub fn classify<'a>(
    token: &'a str,
    issuers: &[String],
    audiences: &[String],
    now: SystemTime,
) -> Shape<'a> {
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Shape::Other;
    };
    // The issuer first, read as the API server reads it: once a token names a known issuer,
    // anything else wrong with it (a header or claim of the wrong shape) refuses it, so that no
    // malformation buys a TokenReview.
    let Ok(payload) = GO_RAW_URL.decode(payload) else {
        return Shape::Other;
    };
    if !issuer(&payload).is_some_and(|iss| issuers.contains(&iss)) {
        return Shape::Other;
    }
    let header = GO_RAW_URL.decode(header);
    let (Ok(header_bytes), Ok(claims), Ok(signature)) = (
        header,
        serde_json::from_slice::<serde_json::Value>(&payload),
        GO_RAW_URL.decode(signature),
    ) else {
        return Shape::Refused(Rejection::Malformed);
    };
    let (Ok(header), Ok(claims)) = (
        serde_json::from_slice::<Header>(&header_bytes),
        serde_json::from_value::<Claims>(claims),
    ) else {
        return Shape::Refused(Rejection::Malformed);
    };
    if claims.exp.is_some_and(|exp| unix(exp) + LEEWAY < now) {
        return Shape::Refused(Rejection::Expired);
    }
    let future = |at: Option<f64>| at.is_some_and(|at| now + LEEWAY < unix(at));
    if future(claims.nbf) || future(claims.iat) {
        return Shape::Refused(Rejection::NotYetValid);
    }
    if !audiences.is_empty() {
        let fits = match &claims.aud {
            Some(Audiences::One(one)) => audiences.contains(one),
            Some(Audiences::Many(many)) => many.iter().any(|a| audiences.contains(a)),
            None => false,
        };
        if !fits {
            return Shape::Refused(Rejection::Audience);
        }
    }
    let Some(algorithm) = Algorithm::from_name(&header.alg) else {
        return Shape::OtherAlgorithm;
    };
    Shape::ServiceAccount(Parsed {
        algorithm,
        kid: header.kid,
        signing_input: signing_input(token, &header_bytes, &payload),
        signature,
        claims,
    })
}

/// What the signature covers: the header and payload encoded canonically, as go-jose verifies
/// (it re-encodes what it decoded), so that a part spelled with its unused bits set verifies
/// as the API server would verify it. A canonical token (every one the issuer makes) is its
/// own signing input, borrowed.
pub(crate) fn signing_input<'a>(token: &'a str, header: &[u8], payload: &[u8]) -> Cow<'a, [u8]> {
    let canonical = format!(
        "{}.{}",
        GO_RAW_URL.encode(header),
        GO_RAW_URL.encode(payload)
    );
    // Up to the last dot: the header and the payload as sent.
    let sent = &token.as_bytes()[..token.rfind('.').unwrap_or(0)];
    if sent == canonical.as_bytes() {
        Cow::Borrowed(sent)
    } else {
        Cow::Owned(canonical.into_bytes())
    }
}

/// The outcome of checking a parsed token against a key set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyCheck {
    /// The signature verifies with the key the token names.
    Verified,
    /// Refused.
    Refused(Rejection),
    /// No key has the token's id: the key set may be older than the token.
    UnknownKey,
}

/// Verifies `parsed` with the key of its `kid` among `keys` (every key that fits its algorithm
/// when it names none).
pub fn check_signature(parsed: &Parsed<'_>, keys: &[PublicKey]) -> KeyCheck {
    let mut candidates = keys
        .iter()
        .filter(|key| key.fits(parsed.algorithm))
        .filter(|key| parsed.kid.is_empty() || key.kid == parsed.kid)
        .peekable();
    if candidates.peek().is_none() {
        return KeyCheck::UnknownKey;
    }
    if candidates.any(|key| key.verify(parsed.algorithm, &parsed.signing_input, &parsed.signature))
    {
        KeyCheck::Verified
    } else {
        KeyCheck::Refused(Rejection::Signature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};

    const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

    fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// The RS256 token and JWKS of `tests/data/service-account-jwt.json`.
    fn rsa_fixture() -> (String, Vec<PublicKey>) {
        let data: serde_json::Value =
            serde_json::from_str(&crate::test_data::text("service-account-jwt.json")).unwrap();
        let keys = parse_jwks(data["jwks"].to_string().as_bytes())
            .unwrap()
            .keys;
        (data["token"].as_str().unwrap().to_owned(), keys)
    }

    /// 2026-06-01, within the fixture token's lifetime.
    fn june_2026() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_780_272_000)
    }

    fn verify(token: &str, keys: &[PublicKey], audiences: &[String], now: SystemTime) -> String {
        match classify(token, &[ISSUER.to_owned()], audiences, now) {
            Shape::Other => "other".into(),
            Shape::Refused(r) => r.as_str().into(),
            Shape::OtherAlgorithm => "other_algorithm".into(),
            Shape::ServiceAccount(parsed) => match check_signature(&parsed, keys) {
                KeyCheck::Verified => "verified".into(),
                KeyCheck::Refused(r) => r.as_str().into(),
                KeyCheck::UnknownKey => "unknown_key".into(),
            },
        }
    }

    #[test]
    fn an_rs256_token_verifies_with_the_published_key_and_not_once_altered() {
        let (token, keys) = rsa_fixture();
        assert_eq!(verify(&token, &keys, &[], june_2026()), "verified");
        // One signature byte changed.
        let (head, signature) = token.rsplit_once('.').unwrap();
        let mut bytes = URL_SAFE_NO_PAD.decode(signature).unwrap();
        bytes[10] ^= 1;
        let forged = format!("{head}.{}", b64(&bytes));
        assert_eq!(verify(&forged, &keys, &[], june_2026()), "signature");
        // The claims changed (another service account), the signature kept.
        let mut parts: Vec<&str> = token.split('.').collect();
        let claims = String::from_utf8(URL_SAFE_NO_PAD.decode(parts[1]).unwrap())
            .unwrap()
            .replace("prometheus", "admin-sa00");
        let claims = b64(claims.as_bytes());
        parts[1] = &claims;
        assert_eq!(
            verify(&parts.join("."), &keys, &[], june_2026()),
            "signature"
        );
    }

    #[test]
    fn claims_refuse_before_any_key_is_looked_at() {
        let (token, keys) = rsa_fixture();
        let after_expiry = UNIX_EPOCH + Duration::from_secs(4_102_444_800 + 61);
        assert_eq!(verify(&token, &keys, &[], after_expiry), "expired");
        // Within the leeway it still verifies.
        let at_expiry = UNIX_EPOCH + Duration::from_secs(4_102_444_800 + 59);
        assert_eq!(verify(&token, &keys, &[], at_expiry), "verified");
        let before_issue = UNIX_EPOCH + Duration::from_secs(1_767_225_600 - 61);
        assert_eq!(verify(&token, &keys, &[], before_issue), "not_yet_valid");
        let other = ["https://other.example".to_owned()];
        assert_eq!(verify(&token, &keys, &other, june_2026()), "audience");
        let ours = [ISSUER.to_owned()];
        assert_eq!(verify(&token, &keys, &ours, june_2026()), "verified");
    }

    #[test]
    fn tokens_of_other_issuers_and_opaque_tokens_are_left_to_token_review() {
        let (token, keys) = rsa_fixture();
        for other in [
            "not-a-jwt",
            "a.b.c",
            "a.b.c.d",
            "",
            &format!("{token}.extra"),
        ] {
            assert_eq!(verify(other, &keys, &[], june_2026()), "other", "{other}");
        }
        let header = b64(br#"{"alg":"RS256","kid":"k"}"#);
        let legacy = b64(br#"{"iss":"kubernetes/serviceaccount","sub":"x"}"#);
        assert_eq!(
            verify(&format!("{header}.{legacy}.c2ln"), &keys, &[], june_2026()),
            "other"
        );
        // An algorithm not verified here (HS256, none, ES512) is told apart: refused when the
        // issuer publishes no key for it (ServiceAccountKeys decides), else TokenReview's.
        let claims = b64(format!(r#"{{"iss":"{ISSUER}"}}"#).as_bytes());
        for alg in ["HS256", "none", "ES512"] {
            let header = b64(format!(r#"{{"alg":"{alg}"}}"#).as_bytes());
            assert_eq!(
                verify(&format!("{header}.{claims}.c2ln"), &keys, &[], june_2026()),
                "other_algorithm",
                "{alg}"
            );
        }
        // Once a token names the issuer, a malformation refuses it: it buys no TokenReview.
        let header = b64(br#"{"alg":"RS256"}"#);
        for claims in [
            format!(r#"{{"iss":"{ISSUER}","exp":"tomorrow"}}"#),
            format!(r#"{{"iss":"{ISSUER}","aud":7}}"#),
        ] {
            let token = format!("{header}.{}.c2ln", b64(claims.as_bytes()));
            assert_eq!(
                verify(&token, &keys, &[], june_2026()),
                "malformed",
                "{claims}"
            );
        }
        let claims = b64(format!(r#"{{"iss":"{ISSUER}"}}"#).as_bytes());
        for (header, signature) in [("e30", "c2ln"), ("bm90LWpzb24", "c2ln"), (&*header, "!!")] {
            let token = format!("{header}.{claims}.{signature}");
            assert_eq!(
                verify(&token, &keys, &[], june_2026()),
                "malformed",
                "{token}"
            );
        }
    }

    /// A new EC key pair of `curve` (`P-256` or `P-384`) and the JWKS publishing it as `kid`.
    fn ec_key(
        signing: &'static ring::signature::EcdsaSigningAlgorithm,
        curve: &str,
        kid: &str,
    ) -> (EcdsaKeyPair, Vec<PublicKey>) {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(signing, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(signing, pkcs8.as_ref(), &rng).unwrap();
        let point = pair.public_key().as_ref();
        let half = (point.len() - 1) / 2;
        let jwks = format!(
            r#"{{"keys":[{{"use":"sig","kty":"EC","crv":"{curve}","kid":"{kid}","x":"{}","y":"{}"}}]}}"#,
            b64(&point[1..=half]),
            b64(&point[1 + half..])
        );
        let keys = parse_jwks(jwks.as_bytes()).unwrap().keys;
        (pair, keys)
    }

    #[test]
    fn an_es256_token_verifies_and_a_key_id_not_published_is_unknown() {
        let rng = SystemRandom::new();
        let (pair, keys) = ec_key(&ECDSA_P256_SHA256_FIXED_SIGNING, "P-256", "ec-1");
        let sign = |kid: &str| {
            let header = b64(format!(r#"{{"alg":"ES256","kid":"{kid}"}}"#).as_bytes());
            let claims = b64(format!(
                r#"{{"iss":"{ISSUER}","aud":"{ISSUER}","exp":4102444800,"iat":1767225600}}"#
            )
            .as_bytes());
            let input = format!("{header}.{claims}");
            let signature = pair.sign(&rng, input.as_bytes()).unwrap();
            format!("{input}.{}", b64(signature.as_ref()))
        };
        assert_eq!(verify(&sign("ec-1"), &keys, &[], june_2026()), "verified");
        assert_eq!(
            verify(&sign("ec-2"), &keys, &[], june_2026()),
            "unknown_key"
        );
        // Named by the RSA key's id: no RSA key fits an ES256 token.
        let (_, rsa) = rsa_fixture();
        assert_eq!(
            verify(&sign("rsa-test-key-1"), &rsa, &[], june_2026()),
            "unknown_key"
        );
    }

    #[test]
    fn an_es384_token_verifies_with_a_p384_key() {
        use ring::signature::ECDSA_P384_SHA384_FIXED_SIGNING;
        let rng = SystemRandom::new();
        let (pair, keys) = ec_key(&ECDSA_P384_SHA384_FIXED_SIGNING, "P-384", "p384");
        let header = b64(br#"{"alg":"ES384","kid":"p384"}"#);
        let claims = b64(format!(r#"{{"iss":"{ISSUER}","exp":4102444800}}"#).as_bytes());
        let input = format!("{header}.{claims}");
        let signature = pair.sign(&rng, input.as_bytes()).unwrap();
        let token = format!("{input}.{}", b64(signature.as_ref()));
        assert_eq!(verify(&token, &keys, &[], june_2026()), "verified");
        // The same key does not verify an ES256 claim of the token.
        let es256 = token.replacen(&header, &b64(br#"{"alg":"ES256","kid":"p384"}"#), 1);
        assert_eq!(verify(&es256, &keys, &[], june_2026()), "unknown_key");
    }

    #[test]
    fn a_jwks_without_a_usable_key_is_an_error() {
        let mixed = r#"{"keys":[{"kty":"EC","crv":"P-521","x":"AA","y":"AA"},
            {"kty":"RSA","n":"AQAB","e":"AQAB"}]}"#;
        let jwks = parse_jwks(mixed.as_bytes()).unwrap();
        assert_eq!((jwks.keys.len(), jwks.complete), (1, false));
        let (_, keys) = rsa_fixture();
        assert_eq!(keys.len(), 1);
        for document in [
            r#"{"keys":[]}"#,
            r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#,
            r#"{"keys":[{"kty":"EC","crv":"P-521","x":"AA","y":"AA"}]}"#,
            r#"{"keys":[{"kty":"RSA","use":"enc","n":"AQAB","e":"AQAB"}]}"#,
        ] {
            assert!(
                matches!(parse_jwks(document.as_bytes()), Err(JwksError::NoUsableKey)),
                "{document}"
            );
        }
        assert!(matches!(parse_jwks(b"<html>"), Err(JwksError::Json(_))));
    }

    /// `part` with the unused low bits of its last character set, if it has any: the same bytes
    /// for Go's decoder, another spelling of them.
    fn with_trailing_bits(part: &str) -> Option<String> {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let unused = match part.len() % 4 {
            2 => 0b1111,
            3 => 0b11,
            _ => return None,
        };
        let last = *part.as_bytes().last()?;
        let value = ALPHABET.iter().position(|&c| c == last)?;
        let spelled = ALPHABET[value | unused] as char;
        Some(format!("{}{spelled}", &part[..part.len() - 1]))
    }

    #[test]
    fn a_token_is_judged_as_the_api_server_reads_it_whatever_its_spelling_and_size() {
        let (token, keys) = rsa_fixture();
        let parts: Vec<&str> = token.split('.').collect();
        let respelled = |index: usize| {
            let mut parts: Vec<String> = parts.iter().map(|p| (*p).to_owned()).collect();
            parts[index] = with_trailing_bits(&parts[index])?;
            Some(parts.join("."))
        };
        // Each part the fixture spells with unused bits (the signature always: 256 bytes) is
        // the same token with them set.
        let mut respelled_parts = 0;
        for index in 0..3 {
            if let Some(spelled) = respelled(index) {
                assert_ne!(spelled, token);
                assert_eq!(
                    verify(&spelled, &keys, &[], june_2026()),
                    "verified",
                    "part {index} spelled with its unused bits set"
                );
                respelled_parts += 1;
            }
        }
        assert!(respelled_parts >= 1);
        // Padding is not Go's raw encoding: the API server does not read it as the issuer's.
        let padded = format!("{}.{}=.{}", parts[0], parts[1], parts[2]);
        assert_eq!(verify(&padded, &keys, &[], june_2026()), "other");

        // A forgery naming the issuer is judged at any size: here 40 KB of claims.
        let header = b64(br#"{"alg":"RS256"}"#);
        let filler = "x".repeat(40_000);
        let claims = b64(format!(r#"{{"iss":"{ISSUER}","pad":"{filler}"}}"#).as_bytes());
        let big = format!("{header}.{claims}.{}", parts[2]);
        assert!(big.len() > 16 * 1024);
        assert_eq!(verify(&big, &keys, &[], june_2026()), "signature");
    }

    #[test]
    fn the_issuer_is_read_as_go_reads_a_struct_field() {
        let named = |payload: &str| issuer(payload.as_bytes());
        let iss = Some(ISSUER.to_owned());
        for payload in [
            format!(r#"{{"iss":"{ISSUER}"}}"#),
            format!(r#"{{"ISS":"{ISSUER}"}}"#),
            format!(r#"{{"Iſs":"{ISSUER}"}}"#),
            format!(r#"{{"iss":"other","iSS":"{ISSUER}"}}"#),
            format!(r#"{{"iss":"{ISSUER}","iss":null}}"#),
            format!(r#"{{"sub":{{"iss":"x"}},"iss":"{ISSUER}"}}"#),
        ] {
            assert_eq!(named(&payload), iss, "{payload}");
        }
        for payload in [
            format!(r#"{{"iss":"{ISSUER}","iss":"other"}}"#),
            r#"{"iss":7}"#.to_owned(),
            format!(r#"{{"iss":"{ISSUER}","iss":7}}"#),
            format!(r#"[{{"iss":"{ISSUER}"}}]"#),
            format!(r#"{{"ıss":"{ISSUER}"}}"#),
            format!(r#"{{"iss":"{ISSUER}"}} trailing"#),
            "{}".to_owned(),
        ] {
            assert_ne!(named(&payload), iss, "{payload}");
        }
        // Go reads bytes that are not UTF-8 as U+FFFD rather than refusing the document.
        let mut bytes = format!(r#"{{"x":"?","iss":"{ISSUER}"}}"#).into_bytes();
        bytes[6] = 0xff;
        assert_eq!(issuer(&bytes), iss);
    }
}
