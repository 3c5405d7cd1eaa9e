//! Cross-origin access, checked in process: preflights answered before authentication, the
//! headers the SDK must read exposed, origins not allowed left without the header.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use deepagents::backends::InMemoryStore;
use deepagents::core::InMemoryCheckpointer;
use deepagents_server::{Assistant, CorsOrigins, ServerError, ServerOptions, StepWatch};
use tower::ServiceExt as _;

fn router(cors: CorsOrigins, keys: bool) -> axum::Router {
    let store = Arc::new(InMemoryStore::new());
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::new()));
    let mut options = ServerOptions::new(
        vec![Assistant::new("agent", super::agent(watch.clone()))],
        store,
        watch,
    );
    options.cors = cors;
    if keys {
        options.api_keys.insert("secret".into(), "team".into());
    }
    deepagents_server::router(options).unwrap()
}

fn preflight(path: &str, origin: &str) -> Request<Body> {
    Request::builder()
        .method("OPTIONS")
        .uri(path)
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "content-type,x-api-key,authorization,x-auth-scheme,last-event-id",
        )
        .body(Body::empty())
        .unwrap()
}

fn header(response: &axum::response::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_ascii_lowercase())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_preflight_from_an_allowed_origin_is_answered_before_the_api_key_is_asked_for() {
    for (cors, origin, expected) in [
        (CorsOrigins::Any, "http://localhost:3000", "*"),
        (
            CorsOrigins::from_list(&["http://localhost:3000".into()]).unwrap(),
            "http://localhost:3000",
            "http://localhost:3000",
        ),
    ] {
        let app = router(cors, true);
        for path in [
            "/threads",
            "/threads/t1/runs/stream",
            "/store/items",
            "/info",
        ] {
            let response = app.clone().oneshot(preflight(path, origin)).await.unwrap();
            assert!(
                response.status().is_success(),
                "{path}: {}",
                response.status()
            );
            assert_eq!(header(&response, "access-control-allow-origin"), expected);
            let allowed = header(&response, "access-control-allow-headers");
            for name in [
                "content-type",
                "x-api-key",
                "authorization",
                "x-auth-scheme",
                "last-event-id",
            ] {
                assert!(allowed.contains(name), "{path}: {name} not in {allowed}");
            }
            assert!(header(&response, "access-control-allow-methods").contains("post"));
        }
        // The actual request: answered (here refused for want of a key) with the headers a
        // browser needs to show the SDK the run id and the page counts.
        let request = Request::builder()
            .method("POST")
            .uri("/threads/search")
            .header("origin", origin)
            .header("content-type", "application/json")
            .body(Body::from("{}"))
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(header(&response, "access-control-allow-origin"), expected);
        let exposed = header(&response, "access-control-expose-headers");
        for name in [
            "content-location",
            "location",
            "x-pagination-total",
            "x-pagination-next",
        ] {
            assert!(exposed.contains(name), "{name} not in {exposed}");
        }
    }
}

#[tokio::test]
async fn origins_not_allowed_get_no_cross_origin_header() {
    let listed = router(
        CorsOrigins::from_list(&["https://ui.example.com".into()]).unwrap(),
        false,
    );
    let response = listed
        .oneshot(preflight("/threads", "http://evil.example"))
        .await
        .unwrap();
    assert_eq!(header(&response, "access-control-allow-origin"), "");
    // Off (the library's default): a preflight is not answered with permission.
    let off = router(CorsOrigins::None, false);
    let response = off
        .oneshot(preflight("/threads", "http://localhost:3000"))
        .await
        .unwrap();
    assert_eq!(header(&response, "access-control-allow-origin"), "");
}

#[test]
fn origins_that_would_never_match_are_refused_with_the_fix() {
    for bad in [
        "localhost:3000",
        "http://localhost:3000/",
        "http://x/path",
        "ftp://x",
        "",
    ] {
        let error = CorsOrigins::from_list(&[bad.to_owned()]).unwrap_err();
        assert!(matches!(error, ServerError::InvalidCorsOrigin(_)), "{bad}");
        assert!(
            error.to_string().contains("scheme://host[:port]"),
            "{error}"
        );
    }
    assert_eq!(CorsOrigins::from_list(&[]).unwrap(), CorsOrigins::None);
    assert_eq!(
        CorsOrigins::from_list(&["http://a:1".into(), "*".into()]).unwrap(),
        CorsOrigins::Any
    );
}
