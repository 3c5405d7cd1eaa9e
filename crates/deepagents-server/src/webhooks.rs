//! Webhooks: a run created with `webhook: URL` has its final record POSTed to that URL once
//! it ends (success, error, interrupted), as LangGraph Platform does.
//!
//! What may be called is the operator's choice ([`WebhookOptions::allowed_hosts`]): the URL's
//! host is checked when the run is created (a 422 naming the setting) and again when it is
//! delivered, on whichever server of a cluster finishes the run. Private, loopback and
//! link-local addresses are used only when listed by address: a name is resolved by this
//! module's resolver, which drops every address not allowed, and the connection goes to the
//! addresses it checked (no redirects, no proxy), so a name cannot be pointed inside later.
//!
//! Delivery runs on a task of its own and never changes the run: failures are logged with
//! the URL's host and the answer's status; connection errors, 5xx and 429 are retried with
//! an exponential back-off.

use std::sync::Arc;
use std::time::Duration;

use deepagents_models::egress::{self, Egress, EgressError};
use hmac::{Hmac, Mac as _};
use reqwest::Url;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use serde_json::Value;
use sha2::Sha256;
use tracing::Instrument as _;

use crate::records::RunRecord;

/// The header carrying the body's signature, `sha256=<hex HMAC-SHA256 of the body>`.
pub const SIGNATURE_HEADER: &str = "X-Deepagents-Signature";
/// The header carrying when the delivery was sent, in seconds since the Unix epoch.
pub const TIMESTAMP_HEADER: &str = "X-Deepagents-Timestamp";

/// Which webhooks the server calls and how.
#[derive(Clone, Debug)]
pub struct WebhookOptions {
    /// The hosts webhook URLs may name, each `host`, `host:port`, `ip`, `ip:port` or
    /// `[ipv6]:port` (without a port: any port); `*` allows any host whose addresses are
    /// public. A private, loopback or link-local address is used only when the address
    /// itself is listed. Empty (the default): webhooks are refused.
    pub allowed_hosts: Vec<String>,
    /// The key deliveries are signed with (HMAC-SHA256 of the body, in
    /// [`SIGNATURE_HEADER`]); `None`: unsigned.
    pub secret: Option<String>,
    /// How many times a delivery is tried (default 5).
    pub attempts: u32,
    /// The wait before the first retry, doubled before each next one (default 1 s).
    pub backoff: Duration,
    /// How long one attempt may take (default 10 s).
    pub timeout: Duration,
}

impl Default for WebhookOptions {
    fn default() -> Self {
        Self {
            allowed_hosts: Vec::new(),
            secret: None,
            attempts: 5,
            backoff: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
        }
    }
}

/// The allow list as the webhook settings give it, with the message a refused URL gets.
struct Policy(Arc<Egress>);

impl Policy {
    fn new(allowed: &[String]) -> Result<Self, String> {
        Egress::new(allowed)
            .map(|egress| Self(Arc::new(egress)))
            .map_err(|why| format!("webhook_allowed_hosts: {why}"))
    }

    /// `text` as a URL a webhook may be sent to, or why not (naming the setting to change).
    fn check(&self, text: &str) -> Result<Url, String> {
        self.0.check(text).map_err(|error| match error {
            EgressError::NotUrl(why) => format!("`webhook` is not a URL ({why}): `{text}`"),
            EgressError::NotAllowed { ref host_port, .. } => format!(
                "`webhook` {error}: add `{host_port}` to `webhook_allowed_hosts` in [server] of the config file, or pass --webhook-allow {host_port} to deepagents serve"
            ),
            other => format!("`webhook`: {other}"),
        })
    }
}

/// `sha256=<hex HMAC-SHA256 of body under secret>`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(mac) => mac,
        // HMAC takes keys of any length.
        Err(_) => return String::new(),
    };
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut hex = String::with_capacity(7 + digest.len() * 2);
    hex.push_str("sha256=");
    for byte in digest {
        hex.push_str(&format!("{byte:02x}"));
    }
    hex
}

/// The webhook a run's payload named, if any (`null` and `""` name none).
pub(crate) fn url_of(record: &RunRecord) -> Option<&str> {
    record
        .kwargs
        .get("webhook")
        .and_then(Value::as_str)
        .filter(|url| !url.is_empty())
}

/// The server's webhooks: the policy, the client, the retries.
pub(crate) struct Webhooks {
    policy: Policy,
    client: reqwest::Client,
    secret: Option<String>,
    attempts: u32,
    backoff: Duration,
}

impl Webhooks {
    /// The webhooks `options` describe, or why they cannot work.
    pub(crate) fn new(options: &WebhookOptions) -> Result<Self, String> {
        let policy = Policy::new(&options.allowed_hosts)?;
        let client = deepagents_models::http_client()
            .dns_resolver(policy.0.resolver())
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(options.timeout)
            .user_agent(concat!("deepagents-server/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| format!("cannot make the webhook client: {error}"))?;
        Ok(Self {
            policy,
            client,
            secret: options.secret.clone().filter(|secret| !secret.is_empty()),
            attempts: options.attempts.max(1),
            backoff: options.backoff,
        })
    }

    /// Checks a run's `webhook` field as a payload gives it: `null` or `""` is none; a URL
    /// must be allowed. The error is the 422's detail.
    pub(crate) fn check_field(&self, webhook: Option<&Value>) -> Result<(), String> {
        match webhook {
            None | Some(Value::Null) => Ok(()),
            Some(Value::String(url)) if url.is_empty() => Ok(()),
            Some(Value::String(url)) => self.policy.check(url).map(drop),
            Some(other) => Err(format!("`webhook` must be a URL string, not {other}")),
        }
    }

    /// Sends `record` (with `values`, the thread's final values, when known) to the webhook
    /// its payload named, on a task of its own; nothing when it named none.
    pub(crate) fn deliver(self: &Arc<Self>, record: &RunRecord, values: Option<Value>) {
        let Some(url) = url_of(record) else {
            return;
        };
        let mut body = serde_json::to_value(record).unwrap_or(Value::Null);
        if let (Value::Object(map), Some(values)) = (&mut body, values) {
            map.entry("values").or_insert(values);
        }
        let body = match serde_json::to_vec(&body) {
            Ok(body) => body,
            Err(error) => {
                tracing::warn!(%error, "a run's webhook body cannot be written");
                return;
            }
        };
        let webhooks = Arc::clone(self);
        let url = url.to_owned();
        tokio::spawn(async move { webhooks.send(&url, body).await }.in_current_span());
    }

    async fn send(&self, url: &str, body: Vec<u8>) {
        // Checked again here: the server finishing the run may not be the one that took it.
        let url = match self.policy.check(url) {
            Ok(url) => url,
            Err(why) => {
                tracing::warn!(%why, "webhook not sent");
                return;
            }
        };
        let host = format!(
            "{}:{}",
            url.host_str().unwrap_or_default(),
            url.port_or_known_default().unwrap_or(0)
        );
        let mut delay = self.backoff;
        for attempt in 1..=self.attempts {
            let mut request = self
                .client
                .post(url.clone())
                .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
                .body(body.clone());
            if let Some(secret) = &self.secret {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |since| since.as_secs());
                request = request
                    .header(TIMESTAMP_HEADER, now.to_string())
                    .header(SIGNATURE_HEADER, signature(secret, &body));
            }
            match request.send().await {
                Ok(response) if response.status().is_success() => {
                    tracing::info!(%host, status = response.status().as_u16(), attempt, "webhook delivered");
                    return;
                }
                Ok(response) => {
                    let status = response.status();
                    let again = status.is_server_error()
                        || status == reqwest::StatusCode::TOO_MANY_REQUESTS;
                    tracing::warn!(%host, status = status.as_u16(), attempt, "webhook refused by its receiver");
                    if !again {
                        return;
                    }
                }
                Err(error) if egress::refused(&error) => {
                    tracing::warn!(%host, error = %error.without_url(), "webhook not sent");
                    return;
                }
                Err(error) => {
                    tracing::warn!(%host, attempt, error = %error.without_url(), "webhook not delivered");
                }
            }
            if attempt < self.attempts {
                tokio::time::sleep(delay).await;
                delay = delay.saturating_mul(2);
            }
        }
        tracing::warn!(%host, attempts = self.attempts, "webhook given up");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn policy(hosts: &[&str]) -> Policy {
        Policy::new(&hosts.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn hosts_are_allowed_only_when_listed_and_internal_addresses_only_by_address() {
        let listed = policy(&["hooks.example.com", "127.0.0.1:9000", "[::1]:8080"]);
        assert!(listed.check("https://hooks.example.com/a?b=c").is_ok());
        assert!(listed.check("http://HOOKS.example.com:81/").is_ok());
        assert!(listed.check("http://127.0.0.1:9000/hook").is_ok());
        assert!(listed.check("http://[::1]:8080/").is_ok());
        let error = listed.check("http://127.0.0.1:9001/hook").unwrap_err();
        assert!(error.contains("webhook_allowed_hosts"), "{error}");
        assert!(error.contains("127.0.0.1:9001"), "{error}");
        assert!(listed.check("http://evil.example.com/").is_err());
        assert!(listed.check("ftp://hooks.example.com/").is_err());
        assert!(listed.check("not a url").is_err());
        // Decimal and mapped forms of loopback are loopback.
        assert!(listed.check("http://2130706433:9000/").is_ok());
        let any = policy(&["*"]);
        assert!(any.check("https://hooks.example.com/").is_ok());
        for internal in [
            "http://127.0.0.1/",
            "http://10.1.2.3/",
            "http://169.254.169.254/latest",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[fe80::1]/",
            "http://0.0.0.0/",
        ] {
            assert!(any.check(internal).is_err(), "{internal}");
        }
        assert!(!any.0.address_allowed("192.168.1.1".parse().unwrap()));
        assert!(any.0.address_allowed("93.184.216.34".parse().unwrap()));
        assert!(
            listed
                .0
                .address_allowed("::ffff:127.0.0.1".parse().unwrap())
        );
        assert!(policy(&[]).check("https://hooks.example.com/").is_err());
        assert!(Policy::new(&["a/b".to_owned()]).is_err());
        assert!(Policy::new(&["host:port".to_owned()]).is_err());
    }

    #[test]
    fn the_signature_is_the_hex_hmac_sha256_of_the_body() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
