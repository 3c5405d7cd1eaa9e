//! Users from bearer JWTs: `Authorization: Bearer <jwt>` verified against static keys (PEM
//! public keys, an HS256 secret) and the keys of a JWKS URL; the user id (`sub`, or another
//! claim) becomes the request's tenant, as an API key's tenant does.
//!
//! A token's algorithm must be one its key is for — an RSA, EC or Ed25519 key verifies only
//! its own family, the HS256 secret only HS256, and `none` nothing — so a token signed with a
//! public key as an HMAC secret is refused. The signature is checked before any claim, so
//! only a genuine token learns that it expired or names another audience.

use std::str::FromStr as _;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

/// How bearer JWTs are verified ([`ServerOptions::jwt`](crate::ServerOptions::jwt)). At least
/// one of [`public_keys`](Self::public_keys), [`hs256_secret`](Self::hs256_secret) and
/// [`jwks_url`](Self::jwks_url) is needed.
#[derive(Clone)]
pub struct JwtOptions {
    /// Public keys in PEM (`-----BEGIN PUBLIC KEY-----`; RSA also as `BEGIN RSA PUBLIC
    /// KEY`): RSA keys verify RS256/384/512 and PS256/384/512, EC keys (P-256, P-384) ES256
    /// and ES384, Ed25519 keys EdDSA.
    pub public_keys: Vec<String>,
    /// A shared secret that verifies HS256 tokens (at least 32 bytes).
    pub hs256_secret: Option<Vec<u8>>,
    /// A JSON Web Key Set's URL (`https`, or `http` on a loopback address): its RSA, EC and
    /// Ed25519 signing keys verify tokens, matched by `kid`. Symmetric (`oct`) keys in it are
    /// ignored.
    pub jwks_url: Option<String>,
    /// The `iss` tokens must carry; `None`: not checked.
    pub issuer: Option<String>,
    /// Audiences of which a token's `aud` must name one (it is then required); empty: `aud`
    /// is not checked.
    pub audience: Vec<String>,
    /// The claim holding the user id (default `sub`).
    pub user_claim: String,
    /// Clock skew allowed for `exp`, `nbf` and `iat` (default 60 s).
    pub leeway: Duration,
    /// The least time between two fetches of the JWKS caused by a token whose `kid` it lacks
    /// (default 30 s), so unknown ids cannot make the server hammer the key set's host.
    pub jwks_refetch_interval: Duration,
    /// How long fetched keys are used before the set is fetched again (default 1 h).
    pub jwks_max_age: Duration,
    /// How long a JWKS fetch may take (default 10 s).
    pub jwks_timeout: Duration,
}

impl Default for JwtOptions {
    fn default() -> Self {
        Self {
            public_keys: Vec::new(),
            hs256_secret: None,
            jwks_url: None,
            issuer: None,
            audience: Vec::new(),
            user_claim: "sub".to_owned(),
            leeway: Duration::from_secs(60),
            jwks_refetch_interval: Duration::from_secs(30),
            jwks_max_age: Duration::from_secs(3600),
            jwks_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a token was refused: the detail of the 401 (or 503) says what is wrong without the
/// verifier's internals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Malformed,
    Algorithm,
    UnknownKey,
    Signature,
    Expired,
    NotYetValid,
    NoExpiry,
    Issuer,
    Audience,
    Claim,
    NoUser,
    /// The key set could not be fetched and no key is known: 503.
    KeysUnavailable,
}

impl Refusal {
    pub(crate) fn detail(self) -> &'static str {
        match self {
            Self::Malformed => "token is not a valid JWT",
            Self::Algorithm => "token algorithm is not allowed",
            Self::UnknownKey => "token signing key is not known",
            Self::Signature => "token signature is not valid",
            Self::Expired => "token expired",
            Self::NotYetValid => "token is not valid yet",
            Self::NoExpiry => "token has no expiry",
            Self::Issuer => "token issuer is not accepted",
            Self::Audience => "token audience is not accepted",
            Self::Claim => "token has a claim of the wrong type",
            Self::NoUser => "token names no user",
            Self::KeysUnavailable => {
                "the keys that verify tokens cannot be fetched now; try again later"
            }
        }
    }

    pub(crate) fn unavailable(self) -> bool {
        self == Self::KeysUnavailable
    }
}

/// A key and the algorithms it verifies.
#[derive(Clone)]
struct Key {
    kid: Option<String>,
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
}

const RSA: [Algorithm; 6] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];

/// The longest user id taken (bytes).
const MAX_USER: usize = 256;
/// The largest key set read (bytes).
const MAX_JWKS: usize = 1024 * 1024;

/// Verifies bearer JWTs.
pub(crate) struct Verifier {
    keys: Vec<Key>,
    jwks: Option<Jwks>,
    issuer: Option<String>,
    audience: Vec<String>,
    user_claim: String,
    leeway: u64,
}

/// A JWKS URL's keys, cached.
struct Jwks {
    url: reqwest::Url,
    client: reqwest::Client,
    refetch_interval: Duration,
    max_age: Duration,
    keys: RwLock<Arc<Vec<Key>>>,
    /// Held while fetching, so concurrent requests wait for one fetch.
    fetches: tokio::sync::Mutex<Fetches>,
}

#[derive(Default)]
struct Fetches {
    /// When a fetch was last tried.
    tried: Option<Instant>,
    /// When the keys were last fetched.
    fetched: Option<Instant>,
}

impl Verifier {
    /// The verifier `options` describe, or why it cannot work.
    pub(crate) fn new(options: &JwtOptions) -> Result<Self, String> {
        // One crypto provider for the process: ours unless the application installed one.
        if jsonwebtoken::crypto::CryptoProvider::try_get_default().is_none() {
            let _ = jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER.install_default();
        }
        let mut keys = Vec::new();
        for (i, pem) in options.public_keys.iter().enumerate() {
            keys.push(
                pem_key(pem.as_bytes())
                    .ok_or_else(|| format!("JWT public key {} is not an RSA, EC or Ed25519 public key in PEM (-----BEGIN PUBLIC KEY-----)", i + 1))?,
            );
        }
        if let Some(secret) = &options.hs256_secret {
            if secret.len() < 32 {
                return Err(format!(
                    "the HS256 secret has {} bytes; use at least 32 (for example `openssl rand -hex 32`)",
                    secret.len()
                ));
            }
            keys.push(Key {
                kid: None,
                key: DecodingKey::from_secret(secret)
                    .map_err(|error| format!("the HS256 secret cannot be used: {error}"))?,
                algorithms: vec![Algorithm::HS256],
            });
        }
        let jwks = options
            .jwks_url
            .as_deref()
            .map(|url| Jwks::new(url, options))
            .transpose()?;
        if keys.is_empty() && jwks.is_none() {
            return Err(
                "JWT authentication needs keys: public keys in PEM, an HS256 secret or a JWKS URL"
                    .to_owned(),
            );
        }
        if options.user_claim.is_empty() {
            return Err("the JWT user claim is empty; name one (default `sub`)".to_owned());
        }
        Ok(Self {
            keys,
            jwks,
            issuer: options.issuer.clone().filter(|issuer| !issuer.is_empty()),
            audience: options.audience.clone(),
            user_claim: options.user_claim.clone(),
            leeway: options.leeway.as_secs(),
        })
    }

    /// The user `token` is for, or why it is refused.
    pub(crate) async fn verify(&self, token: &str) -> Result<String, Refusal> {
        let (algorithm, kid) = header(token)?;
        let mut candidates: Vec<Key> = self
            .keys
            .iter()
            .filter(|key| key.algorithms.contains(&algorithm))
            .cloned()
            .collect();
        let mut fetched = Arc::new(Vec::new());
        if let Some(jwks) = &self.jwks {
            let mut known = jwks.keys();
            let lacks_kid = |keys: &[Key]| {
                kid.as_deref()
                    .is_some_and(|kid| !keys.iter().any(|key| key.kid.as_deref() == Some(kid)))
            };
            if jwks.stale() || lacks_kid(&known) {
                jwks.refresh(lacks_kid(&known)).await;
                known = jwks.keys();
            }
            candidates.extend(
                known
                    .iter()
                    .filter(|key| key.algorithms.contains(&algorithm))
                    .filter(|key| kid.is_none() || key.kid == kid)
                    .cloned(),
            );
            fetched = known;
        }
        if candidates.is_empty() {
            if self.jwks.is_some() && fetched.is_empty() && self.keys.is_empty() {
                return Err(Refusal::KeysUnavailable);
            }
            let algorithm_known = self
                .keys
                .iter()
                .chain(fetched.iter())
                .any(|key| key.algorithms.contains(&algorithm));
            return Err(if algorithm_known && kid.is_some() {
                Refusal::UnknownKey
            } else {
                Refusal::Algorithm
            });
        }
        let validation = self.validation(algorithm);
        let mut claims = None;
        for candidate in &candidates {
            match jsonwebtoken::decode::<serde_json::Map<String, Value>>(
                token,
                &candidate.key,
                &validation,
            ) {
                Ok(data) => {
                    claims = Some(data.claims);
                    break;
                }
                Err(error) => match error.kind() {
                    // Not this key (or not a good signature with any).
                    ErrorKind::InvalidSignature
                    | ErrorKind::InvalidEcdsaKey
                    | ErrorKind::InvalidEddsaKey
                    | ErrorKind::InvalidRsaKey(_)
                    | ErrorKind::InvalidKeyFormat
                    | ErrorKind::InvalidAlgorithm
                    | ErrorKind::Provider(_) => {
                        tracing::debug!(%error, "a JWT did not verify with a key");
                    }
                    // The signature is good: the claims are what is wrong.
                    other => return Err(claims_refusal(other)),
                },
            }
        }
        let claims = claims.ok_or(Refusal::Signature)?;
        match claims.get("iat") {
            None => {}
            Some(Value::Number(iat)) => {
                let now = jsonwebtoken::get_current_timestamp();
                if iat
                    .as_f64()
                    .is_none_or(|iat| iat > (now + self.leeway) as f64)
                {
                    return Err(Refusal::NotYetValid);
                }
            }
            Some(_) => return Err(Refusal::Claim),
        }
        match claims.get(&self.user_claim) {
            Some(Value::String(user)) if !user.is_empty() && user.len() <= MAX_USER => {
                Ok(user.clone())
            }
            _ => Err(Refusal::NoUser),
        }
    }

    fn validation(&self, algorithm: Algorithm) -> Validation {
        let mut validation = Validation::new(algorithm);
        validation.leeway = self.leeway;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        let mut required = vec!["exp"];
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        if self.audience.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&self.audience);
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);
        validation
    }
}

/// A claims error (the signature verified) as a refusal.
fn claims_refusal(kind: &ErrorKind) -> Refusal {
    match kind {
        ErrorKind::ExpiredSignature => Refusal::Expired,
        ErrorKind::ImmatureSignature => Refusal::NotYetValid,
        ErrorKind::InvalidIssuer => Refusal::Issuer,
        ErrorKind::InvalidAudience => Refusal::Audience,
        ErrorKind::MissingRequiredClaim(claim) => match claim.as_str() {
            "exp" => Refusal::NoExpiry,
            "iss" => Refusal::Issuer,
            "aud" => Refusal::Audience,
            _ => Refusal::Claim,
        },
        ErrorKind::InvalidClaimFormat(_) | ErrorKind::InvalidSubject => Refusal::Claim,
        _ => Refusal::Malformed,
    }
}

/// A token's algorithm and `kid`, read before anything is verified: `none`, an unknown
/// algorithm and critical extensions are refused.
fn header(token: &str) -> Result<(Algorithm, Option<String>), Refusal> {
    let mut parts = token.split('.');
    let (Some(header), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::Malformed);
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header.trim_end_matches('='))
        .map_err(|_| Refusal::Malformed)?;
    let Ok(Value::Object(header)) = serde_json::from_slice::<Value>(&bytes) else {
        return Err(Refusal::Malformed);
    };
    if header.contains_key("crit") {
        return Err(Refusal::Malformed);
    }
    let algorithm = match header.get("alg") {
        Some(Value::String(alg)) => Algorithm::from_str(alg).map_err(|_| Refusal::Algorithm)?,
        _ => return Err(Refusal::Algorithm),
    };
    let kid = match header.get("kid") {
        None | Some(Value::Null) => None,
        Some(Value::String(kid)) => Some(kid.clone()),
        Some(_) => return Err(Refusal::Malformed),
    };
    Ok((algorithm, kid))
}

/// A PEM public key and the algorithms of its kind.
fn pem_key(pem: &[u8]) -> Option<Key> {
    let (key, algorithms) = if let Ok(key) = DecodingKey::from_rsa_pem(pem) {
        (key, RSA.to_vec())
    } else if let Ok(key) = DecodingKey::from_ec_pem(pem) {
        (key, vec![Algorithm::ES256, Algorithm::ES384])
    } else if let Ok(key) = DecodingKey::from_ed_pem(pem) {
        (key, vec![Algorithm::EdDSA])
    } else {
        return None;
    };
    Some(Key {
        kid: None,
        key,
        algorithms,
    })
}

/// A key of a key set, if it is a signing key the server uses: RSA, EC (P-256, P-384) or
/// Ed25519, limited to its `alg` when it names one.
fn jwk_key(value: Value) -> Option<Key> {
    let jwk: Jwk = serde_json::from_value(value).ok()?;
    if matches!(jwk.common.public_key_use, Some(ref u) if *u != PublicKeyUse::Signature) {
        return None;
    }
    let mut algorithms = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => RSA.to_vec(),
        AlgorithmParameters::EllipticCurve(params) => match params.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(params) if params.curve == EllipticCurve::Ed25519 => {
            vec![Algorithm::EdDSA]
        }
        // Symmetric keys are secrets, not for a public key set; other kinds are not used.
        _ => return None,
    };
    if let Some(named) = jwk.common.key_algorithm {
        let named = Algorithm::from_str(&format!("{named:?}")).ok()?;
        algorithms.retain(|algorithm| *algorithm == named);
    }
    if algorithms.is_empty() {
        return None;
    }
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    Some(Key {
        kid: jwk.common.key_id,
        key,
        algorithms,
    })
}

impl Jwks {
    fn new(url: &str, options: &JwtOptions) -> Result<Self, String> {
        let parsed = reqwest::Url::parse(url)
            .map_err(|error| format!("the JWKS URL `{url}` is not a URL: {error}"))?;
        let host = parsed.host_str().unwrap_or_default();
        let loopback = host == "localhost"
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        match parsed.scheme() {
            "https" => {}
            "http" if loopback => {}
            _ => {
                return Err(format!(
                    "the JWKS URL `{url}` must be https (http only on a loopback address)"
                ));
            }
        }
        let client = deepagents_models::http_client()
            .timeout(options.jwks_timeout)
            .redirect(reqwest::redirect::Policy::limited(3))
            .user_agent(concat!("deepagents-server/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| format!("cannot make the JWKS client: {error}"))?;
        Ok(Self {
            url: parsed,
            client,
            refetch_interval: options.jwks_refetch_interval,
            max_age: options.jwks_max_age,
            keys: RwLock::new(Arc::new(Vec::new())),
            fetches: tokio::sync::Mutex::new(Fetches::default()),
        })
    }

    fn keys(&self) -> Arc<Vec<Key>> {
        Arc::clone(
            &self
                .keys
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Whether the keys were never fetched or are older than the max age.
    fn stale(&self) -> bool {
        match self.fetches.try_lock() {
            Ok(fetches) => fetches
                .fetched
                .is_none_or(|fetched| fetched.elapsed() >= self.max_age),
            // A fetch is under way: wait for it in `refresh`.
            Err(_) => true,
        }
    }

    /// Fetches the key set again unless it was tried within the refetch interval (`unknown`:
    /// a token names a `kid` the set lacks) or, for a stale set, fetched since.
    async fn refresh(&self, unknown: bool) {
        let mut fetches = self.fetches.lock().await;
        let due = match fetches.tried {
            None => true,
            Some(tried) if unknown => tried.elapsed() >= self.refetch_interval,
            Some(tried) => {
                fetches
                    .fetched
                    .is_none_or(|fetched| fetched.elapsed() >= self.max_age)
                    && tried.elapsed() >= self.refetch_interval.min(self.max_age)
            }
        };
        if !due {
            return;
        }
        fetches.tried = Some(Instant::now());
        match self.fetch().await {
            Ok(keys) => {
                tracing::info!(url = %self.url, keys = keys.len(), "fetched the JWT key set");
                *self
                    .keys
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(keys);
                fetches.fetched = Some(Instant::now());
            }
            Err(error) => {
                tracing::warn!(url = %self.url, %error, "cannot fetch the JWT key set; keeping the keys fetched before");
            }
        }
    }

    async fn fetch(&self) -> Result<Vec<Key>, String> {
        let mut response = self
            .client
            .get(self.url.clone())
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|error| error.to_string())?;
        if !response.status().is_success() {
            return Err(format!("status {}", response.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|error| error.to_string())? {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_JWKS {
                return Err(format!("the key set is larger than {MAX_JWKS} bytes"));
            }
        }
        let set: Value = serde_json::from_slice(&body)
            .map_err(|error| format!("the key set is not JSON: {error}"))?;
        let Some(Value::Array(keys)) = set.get("keys") else {
            return Err("the key set has no `keys` array".to_owned());
        };
        Ok(keys.iter().cloned().filter_map(jwk_key).collect())
    }
}

/// The tenant of user `user`: letters, digits and `-` kept, every other byte (`_` included)
/// written `_XX` in hex, so two users never share a tenant and the name is usable in storage
/// (`alice@example.com` → `alice_40example_2Ecom`).
pub(crate) fn tenant_of(user: &str) -> String {
    let mut tenant = String::with_capacity(user.len());
    for byte in user.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' {
            tenant.push(char::from(byte));
        } else {
            tenant.push_str(&format!("_{byte:02X}"));
        }
    }
    tenant
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_of_users_are_distinct_and_storable() {
        assert_eq!(tenant_of("alice"), "alice");
        assert_eq!(tenant_of("alice@example.com"), "alice_40example_2Ecom");
        assert_eq!(tenant_of("a_b"), "a_5Fb");
        assert_ne!(tenant_of("a_5Fb"), tenant_of("a_b"));
        assert_eq!(tenant_of("auth0|1"), "auth0_7C1");
    }
}
