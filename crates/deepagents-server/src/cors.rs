//! Cross-origin access: which web pages a browser lets call the server.

use axum::http::{HeaderName, HeaderValue, Method, header};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer, ExposeHeaders};

use crate::ServerError;

/// Which origins' pages may call the server from a browser. A web client served from another
/// origin (agent-chat-ui on `http://localhost:3000`, a React app built on the LangGraph SDK)
/// needs its origin here; a client that is not a browser needs nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CorsOrigins {
    /// No page of another origin: browsers refuse their requests.
    #[default]
    None,
    /// Pages of any origin (`*`). Right for a server on loopback without API keys; with keys,
    /// any page whose user holds a key can use it.
    Any,
    /// Pages of these origins (`scheme://host[:port]`, as browsers send `Origin`).
    List(Vec<String>),
}

impl CorsOrigins {
    /// `origins` as given on a command line or in a config file: `*` means any origin, an
    /// empty list none.
    pub fn from_list(origins: &[String]) -> Result<Self, ServerError> {
        if origins.is_empty() {
            return Ok(Self::None);
        }
        if origins.iter().any(|origin| origin == "*") {
            return Ok(Self::Any);
        }
        for origin in origins {
            check_origin(origin)?;
        }
        Ok(Self::List(origins.to_vec()))
    }

    /// The layer answering preflights and marking responses, or `None` when no other origin
    /// is allowed.
    pub(crate) fn layer(&self) -> Result<Option<CorsLayer>, ServerError> {
        let allow_origin = match self {
            Self::None => return Ok(None),
            Self::Any => AllowOrigin::any(),
            Self::List(origins) => {
                let mut values = Vec::with_capacity(origins.len());
                for origin in origins {
                    check_origin(origin)?;
                    values.push(
                        HeaderValue::from_str(origin)
                            .map_err(|_| ServerError::InvalidCorsOrigin(origin.clone()))?,
                    );
                }
                AllowOrigin::list(values)
            }
        };
        Ok(Some(
            CorsLayer::new()
                .allow_origin(allow_origin)
                .allow_methods([
                    Method::GET,
                    Method::POST,
                    Method::PUT,
                    Method::PATCH,
                    Method::DELETE,
                    Method::OPTIONS,
                ])
                // The SDKs send content-type, x-api-key, authorization, x-auth-scheme and
                // last-event-id; custom clients add their own, which the reference server
                // allows too.
                .allow_headers(AllowHeaders::mirror_request())
                // Without these a browser hides them from the SDK, which then cannot learn a
                // stream's run id (Stop, rejoin) or page through results.
                .expose_headers(ExposeHeaders::list([
                    header::CONTENT_LOCATION,
                    header::LOCATION,
                    HeaderName::from_static("x-pagination-total"),
                    HeaderName::from_static("x-pagination-next"),
                ]))
                .max_age(std::time::Duration::from_secs(3600)),
        ))
    }
}

/// An origin is a scheme, a host and maybe a port — no path, no trailing slash — as browsers
/// send it; anything else would never match and silently block the page.
fn check_origin(origin: &str) -> Result<(), ServerError> {
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    let valid = rest.is_some_and(|host| {
        !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
    });
    if valid {
        Ok(())
    } else {
        Err(ServerError::InvalidCorsOrigin(origin.to_owned()))
    }
}
