//! The chat page served at `/`: one static page (HTML, CSS, vanilla JavaScript, no build step)
//! that talks to the server through the same public API as any other client, so a person who
//! starts `deepagents serve` can open its address in a browser and chat.
//!
//! The assets are embedded in the binary and served without an API key: they hold no data,
//! and the page sends the key with each API call it makes. Every asset goes out with a strict
//! Content-Security-Policy, so the page can reach no other host whatever a model writes.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("chat/index.html");
const SCRIPT: &str = include_str!("chat/chat.js");
const STYLE: &str = include_str!("chat/chat.css");

/// Scripts and styles only from the server itself (no inline script, no inline style
/// sheet), requests only to it, images only from it or `data:` URLs, and no framing: model
/// output can neither load nor send anything elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// An embedded asset with its type and the headers every asset carries.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CSP),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
            // Revalidated each time: a newer binary's page must not mix with an older cached
            // script (there are no version tags in the asset names).
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

/// `GET /`: the page.
pub async fn page() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

/// `GET /chat.js`: the page's script.
pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /chat.css`: the page's style sheet.
pub async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_assets_and_never_parses_text_as_html() {
        assert!(INDEX.contains(r#"src="/chat.js""#));
        assert!(INDEX.contains(r#"href="/chat.css""#));
        // No CDN, no other host: every URL the assets name is the server's own.
        for asset in [INDEX, SCRIPT, STYLE] {
            assert!(!asset.contains("http://") && !asset.contains("https://"));
            assert!(!asset.contains("//cdn"));
        }
        // Model and tool text reach the page only as text: nothing parses markup.
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!SCRIPT.contains(sink), "chat.js uses {sink}");
        }
        // The policy allows no inline script, so the page has none: no script element
        // without a source, no event handler attribute (` onclick=`…).
        assert!(!INDEX.contains("<script>"));
        let handler = INDEX.split(" on").skip(1).any(|rest| {
            let name: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
            !name.is_empty() && rest[name.len()..].starts_with('=')
        });
        assert!(!handler, "index.html has an inline event handler");
    }
}
