//! Bearer JWTs: users as tenants, tokens verified against a local JWKS server (EC P-256 keys
//! made in the test with ring) and static keys (an Ed25519 PEM, an HS256 secret); every token
//! that must not pass is a 401 saying what is wrong; a new `kid` refetches the key set, at
//! most once per interval; the official Python SDK sends the header.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use deepagents::backends::InMemoryStore;
use deepagents::core::InMemoryCheckpointer;
use deepagents_server::{Assistant, JwtOptions, ServerError, ServerOptions, StepWatch};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair as _,
};
use serde_json::{Value, json};
use tower::ServiceExt as _;

const ISSUER: &str = "https://idp.example.test/";
const AUDIENCE: &str = "deepagents";

/// An EC P-256 key pair of the identity provider, under a `kid`.
struct EcKey {
    kid: String,
    pkcs8: Vec<u8>,
    /// The uncompressed point: 0x04, x, y.
    public: Vec<u8>,
}

impl EcKey {
    fn new(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        Self {
            kid: kid.to_owned(),
            pkcs8: pkcs8.as_ref().to_vec(),
            public: pair.public_key().as_ref().to_vec(),
        }
    }

    fn jwk(&self) -> Value {
        json!({
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": self.kid,
            "x": URL_SAFE_NO_PAD.encode(&self.public[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&self.public[33..]),
        })
    }

    /// The public key in PEM (SubjectPublicKeyInfo), as a forger would find it.
    fn pem(&self) -> String {
        let mut der = hex("3059301306072a8648ce3d020106082a8648ce3d030107034200");
        der.extend_from_slice(&self.public);
        pem("PUBLIC KEY", &der)
    }

    fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &EncodingKey::from_ec_der(&self.pkcs8)).unwrap()
    }
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn pem(label: &str, der: &[u8]) -> String {
    let body = STANDARD.encode(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|chunk| std::str::from_utf8(chunk).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Claims of a good token for `user`.
fn claims(user: &str) -> Value {
    json!({"sub": user, "iss": ISSUER, "aud": AUDIENCE, "exp": now() + 600, "iat": now()})
}

/// A token with `header` and `claims` as given and `signature`, unverified.
fn raw_token(header: &Value, claims: &Value, signature: &[u8]) -> String {
    format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string()),
        URL_SAFE_NO_PAD.encode(signature)
    )
}

/// A JWKS server on 127.0.0.1: the set it serves can be changed; it counts its fetches.
struct KeySet {
    url: String,
    keys: Arc<Mutex<Vec<Value>>>,
    fetches: Arc<AtomicUsize>,
}

async fn key_set(keys: Vec<Value>) -> KeySet {
    let keys = Arc::new(Mutex::new(keys));
    let fetches = Arc::new(AtomicUsize::new(0));
    let served = Arc::clone(&keys);
    let counted = Arc::clone(&fetches);
    let app = axum::Router::new().route(
        "/.well-known/jwks.json",
        axum::routing::get(move || {
            let served = Arc::clone(&served);
            let counted = Arc::clone(&counted);
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                axum::Json(json!({"keys": *served.lock().unwrap()}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    KeySet {
        url: format!("http://{address}/.well-known/jwks.json"),
        keys,
        fetches,
    }
}

fn jwt_options(jwks_url: &str) -> JwtOptions {
    JwtOptions {
        jwks_url: Some(jwks_url.to_owned()),
        issuer: Some(ISSUER.to_owned()),
        audience: vec![AUDIENCE.to_owned()],
        ..JwtOptions::default()
    }
}

fn server_options(jwt: JwtOptions, api_keys: &[(&str, &str)]) -> ServerOptions {
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::new()));
    let mut options = ServerOptions::new(
        vec![Assistant::new("agent", super::agent(watch.clone()))],
        Arc::new(InMemoryStore::new()),
        watch,
    );
    options.jwt = Some(jwt);
    options.api_keys = api_keys
        .iter()
        .map(|(key, tenant)| ((*key).to_owned(), (*tenant).to_owned()))
        .collect::<BTreeMap<_, _>>();
    options
}

/// A call with `Authorization: <authorization>` (or `x-api-key` when it starts so).
async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    body: Value,
    authorization: Option<&str>,
) -> (StatusCode, Value, HeaderMap) {
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    match authorization {
        Some(key) if key.starts_with("x-api-key:") => {
            request = request.header("x-api-key", key.trim_start_matches("x-api-key:"));
        }
        Some(value) => request = request.header("authorization", value),
        None => {}
    }
    let body = if body.is_null() {
        Body::empty()
    } else {
        Body::from(body.to_string())
    };
    let response = app
        .clone()
        .oneshot(request.body(body).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers,
    )
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_user_sees_only_their_own_threads_runs_store_items_and_crons() {
    let idp = EcKey::new("k1");
    let jwks = key_set(vec![idp.jwk()]).await;
    let app = deepagents_server::router(server_options(
        jwt_options(&jwks.url),
        &[("team-key", "team")],
    ))
    .unwrap();
    let alice = bearer(&idp.sign(&claims("alice@example.com")));
    let bob = bearer(&idp.sign(&claims("bob")));
    let alice = Some(alice.as_str());
    let bob = Some(bob.as_str());

    let (status, thread, _) = call(
        &app,
        "POST",
        "/threads",
        json!({"metadata": {"mine": true}}),
        alice,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{thread}");
    let id = thread["thread_id"].as_str().unwrap().to_owned();
    let (status, _, _) = call(&app, "GET", &format!("/threads/{id}"), Value::Null, alice).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body, _) = call(
        &app,
        "POST",
        &format!("/threads/{id}/runs/wait"),
        json!({"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "hi"}]}}),
        alice,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["messages"][1]["content"], "Hello from the library.");
    let (status, body, _) = call(
        &app,
        "PUT",
        "/store/items",
        json!({"namespace": ["notes"], "key": "k", "value": {"v": 1}}),
        alice,
    )
    .await;
    assert!(status.is_success(), "{status} {body}");
    let (status, cron, _) = call(
        &app,
        "POST",
        "/runs/crons",
        json!({"assistant_id": "agent", "schedule": "0 9 * * *"}),
        alice,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{cron}");

    // Bob, and the API key's tenant, see none of it.
    for other in [bob, Some("x-api-key:team-key"), Some("Bearer team-key")] {
        for path in [
            format!("/threads/{id}"),
            format!("/threads/{id}/state"),
            format!("/threads/{id}/runs"),
        ] {
            let (status, body, _) = call(&app, "GET", &path, Value::Null, other).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{other:?} {path}: {body}");
        }
        let (status, found, _) = call(&app, "POST", "/threads/search", json!({}), other).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(found, json!([]), "{other:?}");
        let (status, _, _) = call(
            &app,
            "GET",
            "/store/items?namespace=notes&key=k",
            Value::Null,
            other,
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{other:?}");
        let (_, items, _) = call(
            &app,
            "POST",
            "/store/items/search",
            json!({"namespace_prefix": ["notes"]}),
            other,
        )
        .await;
        assert_eq!(items["items"], json!([]), "{other:?}");
        let (_, crons, _) = call(&app, "POST", "/runs/crons/search", json!({}), other).await;
        assert_eq!(crons, json!([]), "{other:?}");
    }
    // Alice sees hers.
    let (_, found, _) = call(&app, "POST", "/threads/search", json!({}), alice).await;
    assert_eq!(found.as_array().unwrap().len(), 1, "{found}");
    assert_eq!(found[0]["thread_id"], id.as_str());
    let (status, item, _) = call(
        &app,
        "GET",
        "/store/items?namespace=notes&key=k",
        Value::Null,
        alice,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(item["value"], json!({"v": 1}));
    let (_, crons, _) = call(&app, "POST", "/runs/crons/search", json!({}), alice).await;
    assert_eq!(crons[0]["cron_id"], cron["cron_id"]);
    // Bob's own thread is his alone; the API key works beside the tokens.
    let (status, _, _) = call(&app, "POST", "/threads", json!({}), bob).await;
    assert_eq!(status, StatusCode::OK);
    let (_, found, _) = call(&app, "POST", "/threads/search", json!({}), bob).await;
    assert_eq!(found.as_array().unwrap().len(), 1);
    let (status, _, _) = call(
        &app,
        "POST",
        "/threads",
        json!({}),
        Some("x-api-key:team-key"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    // No credentials, or an unknown API key: 401 naming both ways in.
    for nothing in [None, Some("x-api-key:nope"), Some("Bearer nope")] {
        let (status, body, _) = call(&app, "POST", "/threads/search", json!({}), nothing).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{nothing:?}");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("Authorization: Bearer"),
            "{body}"
        );
    }
    // The key set was fetched once for all of it.
    assert_eq!(jwks.fetches.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_that_must_not_pass_are_401s_saying_what_is_wrong() {
    let idp = EcKey::new("k1");
    let jwks = key_set(vec![idp.jwk()]).await;
    let app = deepagents_server::router(server_options(jwt_options(&jwks.url), &[])).unwrap();
    let good = claims("alice");
    let with = |change: Value| {
        let mut claims = good.clone();
        for (key, value) in change.as_object().unwrap() {
            if value.is_null() {
                claims.as_object_mut().unwrap().remove(key);
            } else {
                claims[key] = value.clone();
            }
        }
        claims
    };
    let impostor = EcKey::new("k1");
    let header = json!({"alg": "ES256", "typ": "JWT", "kid": "k1"});
    let signing_input = |header: &Value, claims: &Value| {
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        )
    };
    let good_token = idp.sign(&good);
    let tampered = {
        // Alice's signature over Bob's claims.
        let signature = good_token.rsplit('.').next().unwrap();
        format!("{}.{signature}", signing_input(&header, &claims("bob")))
    };
    let mut cases: Vec<(&str, String, &str)> = vec![
        (
            "expired",
            idp.sign(&with(json!({"exp": now() - 3600}))),
            "token expired",
        ),
        (
            "signed by another key",
            impostor.sign(&good),
            "token signature is not valid",
        ),
        ("claims changed", tampered, "token signature is not valid"),
        (
            "alg none",
            raw_token(&json!({"alg": "none", "typ": "JWT"}), &good, b""),
            "token algorithm is not allowed",
        ),
        (
            "alg None",
            raw_token(&json!({"alg": "None", "kid": "k1"}), &good, b""),
            "token algorithm is not allowed",
        ),
        (
            "no sub",
            idp.sign(&with(json!({"sub": null}))),
            "token names no user",
        ),
        (
            "empty sub",
            idp.sign(&with(json!({"sub": ""}))),
            "token names no user",
        ),
        (
            "sub not a string",
            idp.sign(&with(json!({"sub": 7}))),
            "token names no user",
        ),
        (
            "wrong aud",
            idp.sign(&with(json!({"aud": "another-api"}))),
            "token audience is not accepted",
        ),
        (
            "no aud",
            idp.sign(&with(json!({"aud": null}))),
            "token audience is not accepted",
        ),
        (
            "wrong iss",
            idp.sign(&with(json!({"iss": "https://evil.test/"}))),
            "token issuer is not accepted",
        ),
        (
            "no iss",
            idp.sign(&with(json!({"iss": null}))),
            "token issuer is not accepted",
        ),
        (
            "no exp",
            idp.sign(&with(json!({"exp": null}))),
            "token has no expiry",
        ),
        (
            "nbf ahead",
            idp.sign(&with(json!({"nbf": now() + 3600}))),
            "token is not valid yet",
        ),
        (
            "iat ahead",
            idp.sign(&with(json!({"iat": now() + 3600}))),
            "token is not valid yet",
        ),
        (
            "unknown kid",
            {
                let mut header = Header::new(Algorithm::ES256);
                header.kid = Some("k9".into());
                jsonwebtoken::encode(&header, &good, &EncodingKey::from_ec_der(&idp.pkcs8)).unwrap()
            },
            "token signing key is not known",
        ),
        ("not a JWT", "a.b.c".to_owned(), "token is not a valid JWT"),
        (
            "bad signature encoding",
            format!("{}.!!", signing_input(&header, &good)),
            "token is not a valid JWT",
        ),
    ];
    // HS256 forged with the public key, in every form a forger might use, as the secret: an
    // EC key verifies ES256 only.
    let secrets: Vec<Vec<u8>> = vec![
        idp.pem().into_bytes(),
        idp.public.clone(),
        idp.jwk().to_string().into_bytes(),
    ];
    for secret in &secrets {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("k1".into());
        let token =
            jsonwebtoken::encode(&header, &good, &EncodingKey::from_secret(secret).unwrap())
                .unwrap();
        cases.push((
            "HS256 with the public key",
            token,
            "token algorithm is not allowed",
        ));
    }
    for (case, token, detail) in cases {
        let (status, body, headers) = call(
            &app,
            "POST",
            "/threads/search",
            json!({}),
            Some(&bearer(&token)),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{case}: {body}");
        assert_eq!(body, json!({"detail": detail}), "{case}");
        let challenge = headers["www-authenticate"].to_str().unwrap();
        assert!(
            challenge.starts_with("Bearer error=\"invalid_token\""),
            "{case}: {challenge}"
        );
    }
    // Within the leeway (60 s), a token just expired or from a clock a little ahead passes.
    for change in [
        json!({"exp": now() - 30}),
        json!({"nbf": now() + 30, "iat": now() + 30}),
    ] {
        let token = idp.sign(&with(change.clone()));
        let (status, body, _) = call(
            &app,
            "POST",
            "/threads/search",
            json!({}),
            Some(&bearer(&token)),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{change}: {body}");
    }
    // `aud` as a list naming ours passes; the scheme is case-insensitive.
    let token = idp.sign(&with(json!({"aud": ["other", AUDIENCE]})));
    let (status, _, _) = call(
        &app,
        "POST",
        "/threads/search",
        json!({}),
        Some(&format!("bearer {token}")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_keys_verify_tokens_without_a_key_set() {
    let rng = SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let mut spki = hex("302a300506032b6570032100");
    spki.extend_from_slice(pair.public_key().as_ref());
    let public_pem = pem("PUBLIC KEY", &spki);
    let secret = b"0123456789abcdef0123456789abcdef-shared".to_vec();
    let jwt = JwtOptions {
        public_keys: vec![public_pem.clone()],
        hs256_secret: Some(secret.clone()),
        ..JwtOptions::default()
    };
    let app = deepagents_server::router(server_options(jwt, &[])).unwrap();
    let claims = json!({"sub": "carol", "exp": now() + 600});
    let ed = jsonwebtoken::encode(
        &Header::new(Algorithm::EdDSA),
        &claims,
        &EncodingKey::from_ed_der(pkcs8.as_ref()),
    )
    .unwrap();
    let hs = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(&secret).unwrap(),
    )
    .unwrap();
    let (status, thread, _) = call(&app, "POST", "/threads", json!({}), Some(&bearer(&ed))).await;
    assert_eq!(status, StatusCode::OK, "{thread}");
    let id = thread["thread_id"].as_str().unwrap();
    // Both tokens name carol: one tenant.
    let (status, _, _) = call(
        &app,
        "GET",
        &format!("/threads/{id}"),
        Value::Null,
        Some(&bearer(&hs)),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    // HS256 signed with the Ed25519 public key (PEM or raw) is checked against the secret
    // only, and fails.
    for forged_secret in [public_pem.as_bytes(), pair.public_key().as_ref()] {
        let forged = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(forged_secret).unwrap(),
        )
        .unwrap();
        let (status, body, _) = call(
            &app,
            "GET",
            &format!("/threads/{id}"),
            Value::Null,
            Some(&bearer(&forged)),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(body["detail"], "token signature is not valid");
    }
    // No EC or RSA key is configured.
    let es = EcKey::new("k1").sign(&claims);
    let (status, body, _) = call(
        &app,
        "GET",
        &format!("/threads/{id}"),
        Value::Null,
        Some(&bearer(&es)),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["detail"], "token algorithm is not allowed");
    // A JWT that is not the right kind of credential at all, without tokens configured:
    // the API key message as before.
    let plain = deepagents_server::router(server_options_without_jwt(&[("k", "t")])).unwrap();
    let (status, body, _) = call(
        &plain,
        "POST",
        "/threads/search",
        json!({}),
        Some(&bearer(&hs)),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        body["detail"].as_str().unwrap().contains("API key"),
        "{body}"
    );

    // Settings that cannot work are refused when the server is set up.
    for (jwt, says) in [
        (JwtOptions::default(), "needs keys"),
        (
            JwtOptions {
                public_keys: vec![
                    "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n".into(),
                ],
                ..JwtOptions::default()
            },
            "JWT public key 1",
        ),
        (
            JwtOptions {
                hs256_secret: Some(b"short".to_vec()),
                ..JwtOptions::default()
            },
            "at least 32",
        ),
        (
            JwtOptions {
                jwks_url: Some("http://idp.example.com/jwks.json".into()),
                ..JwtOptions::default()
            },
            "must be https",
        ),
        (
            JwtOptions {
                jwks_url: Some("not a url".into()),
                ..JwtOptions::default()
            },
            "is not a URL",
        ),
    ] {
        let error = deepagents_server::router(server_options(jwt, &[]))
            .err()
            .unwrap();
        assert!(matches!(error, ServerError::Jwt(_)), "{error}");
        assert!(error.to_string().contains(says), "{error}");
    }
}

fn server_options_without_jwt(api_keys: &[(&str, &str)]) -> ServerOptions {
    let mut options = server_options(JwtOptions::default(), api_keys);
    options.jwt = None;
    options
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_kid_refetches_the_key_set_at_most_once_per_interval() {
    let first = EcKey::new("k1");
    let second = EcKey::new("k2");
    let jwks = key_set(vec![first.jwk()]).await;
    let mut options = jwt_options(&jwks.url);
    options.jwks_refetch_interval = Duration::from_millis(400);
    let app = deepagents_server::router(server_options(options, &[])).unwrap();
    let search = |token: String| {
        let app = app.clone();
        async move {
            let (status, body, _) = call(
                &app,
                "POST",
                "/threads/search",
                json!({}),
                Some(&bearer(&token)),
            )
            .await;
            (status, body)
        }
    };
    assert_eq!(search(first.sign(&claims("dave"))).await.0, StatusCode::OK);
    assert_eq!(jwks.fetches.load(Ordering::SeqCst), 1);
    // The provider rotates: k2 is published beside k1.
    jwks.keys.lock().unwrap().push(second.jwk());
    // Right after the last fetch, an unknown kid does not fetch again.
    let (status, body) = search(second.sign(&claims("dave"))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["detail"], "token signing key is not known");
    assert_eq!(jwks.fetches.load(Ordering::SeqCst), 1);
    // Once the interval has passed, it does, and the token verifies; k1 still does too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(search(second.sign(&claims("dave"))).await.0, StatusCode::OK);
    assert_eq!(jwks.fetches.load(Ordering::SeqCst), 2);
    assert_eq!(search(first.sign(&claims("dave"))).await.0, StatusCode::OK);
    // A stream of tokens with made-up kids costs at most one fetch per interval.
    let forger = EcKey::new("k-made-up");
    for _ in 0..20 {
        assert_eq!(
            search(forger.sign(&claims("dave"))).await.0,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(jwks.fetches.load(Ordering::SeqCst), 2);
    // Keys the set no longer publishes stop verifying after the next fetch.
    *jwks.keys.lock().unwrap() = vec![second.jwk()];
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, _) = search(forger.sign(&claims("dave"))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(jwks.fetches.load(Ordering::SeqCst), 3);
    let (status, body) = search(first.sign(&claims("dave"))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(search(second.sign(&claims("dave"))).await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_key_set_is_a_503_until_it_answers() {
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/jwks.json", closed.local_addr().unwrap());
    drop(closed);
    let app = deepagents_server::router(server_options(jwt_options(&url), &[])).unwrap();
    let token = EcKey::new("k1").sign(&claims("erin"));
    let (status, body, _) = call(
        &app,
        "POST",
        "/threads/search",
        json!({}),
        Some(&bearer(&token)),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("try again"),
        "{body}"
    );
}

/// The official Python SDK sends the token as `get_client(url, headers=…)` does, and each
/// user's client sees only that user's threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdk_authenticates_with_a_bearer_token() {
    let Some(python) = deepagents_test_support::langgraph_python() else {
        return;
    };
    let idp = EcKey::new("k1");
    let jwks = key_set(vec![idp.jwk()]).await;
    let options = server_options(jwt_options(&jwks.url), &[]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(deepagents_server::serve(listener, options, async {
        let _ = stopped.await;
    }));
    let alice = idp.sign(&claims("alice"));
    let bob = idp.sign(&claims("bob"));
    let expired =
        idp.sign(&json!({"sub": "alice", "iss": ISSUER, "aud": AUDIENCE, "exp": now() - 3600}));
    let script = r#"
import asyncio, sys
import httpx
from langgraph_sdk import get_client

url, alice, bob, expired = sys.argv[1:5]

async def main():
    as_alice = get_client(url=url, headers={"Authorization": f"Bearer {alice}"})
    as_bob = get_client(url=url, headers={"Authorization": f"Bearer {bob}"})
    thread = await as_alice.threads.create(metadata={"owner": "alice"})
    result = await as_alice.runs.wait(
        thread["thread_id"], "agent", input={"messages": [{"role": "user", "content": "hi"}]}
    )
    assert result["messages"][-1]["content"] == "Hello from the library.", result
    assert [t["thread_id"] for t in await as_alice.threads.search()] == [thread["thread_id"]]
    assert await as_bob.threads.search() == []
    try:
        await as_bob.threads.get(thread["thread_id"])
        raise AssertionError("bob read alice's thread")
    except httpx.HTTPStatusError as error:
        assert error.response.status_code == 404, error.response.text
    try:
        await get_client(url=url, headers={"Authorization": f"Bearer {expired}"}).threads.search()
        raise AssertionError("an expired token was taken")
    except httpx.HTTPStatusError as error:
        assert error.response.status_code == 401, error.response.text
        assert error.response.json()["detail"] == "token expired"
    print("sdk jwt passed")

asyncio.run(main())
"#;
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg("-c")
            .arg(script)
            .arg(format!("http://{address}"))
            .args([alice, bob, expired])
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    assert!(
        output.status.success()
            && String::from_utf8_lossy(&output.stdout).contains("sdk jwt passed"),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
