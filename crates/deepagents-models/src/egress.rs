//! Where outgoing requests made on a model's or a client's say may go: web pages the agent
//! fetches, webhooks the server calls. A URL names a host; an [`Egress`] says whether that
//! host (and port) may be called, and its [`resolver`](Egress::resolver) keeps only the
//! addresses allowed, so the connection goes to an address that was checked — a name cannot
//! be pointed at a private address between the check and the request.
//!
//! Private, loopback, link-local and the other internal ranges are reached only when the
//! address itself is listed: a listed name that resolves inside is still refused.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use reqwest::Url;

/// One listed host.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    Name(String),
    Ip(IpAddr),
}

#[derive(Debug, Clone)]
struct Entry {
    host: Host,
    /// `None`: any port.
    port: Option<u16>,
}

/// Which hosts requests may reach.
#[derive(Debug, Default)]
pub struct Egress {
    /// Any host whose addresses are public (`*`).
    any_public: bool,
    entries: Vec<Entry>,
}

/// Why a URL may not be called.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// Not a URL at all.
    #[error("not a URL ({0})")]
    NotUrl(String),
    /// Another scheme than `http` or `https`.
    #[error("only http and https URLs are allowed, not {0}:")]
    Scheme(String),
    /// No host, or one that cannot be read.
    #[error("the URL has no usable host")]
    NoHost,
    /// The host is not allowed; `host_port` is how to list it.
    #[error("host `{host_port}` is not allowed{}", if *internal { " (a private, loopback or link-local address is reached only when listed)" } else { "" })]
    NotAllowed {
        /// `host:port` as it would be listed.
        host_port: String,
        /// Whether the host is an internal address.
        internal: bool,
    },
}

impl Egress {
    /// An allow list: each entry `host`, `host:port`, `ip`, `ip:port` or `[ipv6]:port`
    /// (without a port: any port), or `*` for any host whose addresses are public.
    pub fn new(allowed: &[String]) -> Result<Self, String> {
        let mut egress = Self::default();
        for text in allowed {
            if text.trim() == "*" {
                egress.any_public = true;
            } else {
                egress.entries.push(parse_entry(text)?);
            }
        }
        Ok(egress)
    }

    /// Any public host, plus the internal ones `allowed` lists (same forms as [`Egress::new`]).
    pub fn public_and(allowed: &[String]) -> Result<Self, String> {
        let mut egress = Self::new(allowed)?;
        egress.any_public = true;
        Ok(egress)
    }

    /// Whether a connection may go to `ip`: a public address, or one listed.
    pub fn address_allowed(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        !is_internal(ip) || self.entries.iter().any(|entry| entry.host == Host::Ip(ip))
    }

    /// `text` as a URL that may be called, or why not.
    pub fn check(&self, text: &str) -> Result<Url, EgressError> {
        let url = Url::parse(text).map_err(|error| EgressError::NotUrl(error.to_string()))?;
        self.check_url(&url)?;
        Ok(url)
    }

    /// Whether `url` may be called (a redirect's target, say).
    pub fn check_url(&self, url: &Url) -> Result<(), EgressError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(EgressError::Scheme(url.scheme().to_owned()));
        }
        let raw = url.host_str().ok_or(EgressError::NoHost)?;
        let host = match raw.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            Some(v6) => Host::Ip(
                v6.parse::<IpAddr>()
                    .map_err(|_| EgressError::NoHost)?
                    .to_canonical(),
            ),
            None => match raw.parse::<IpAddr>() {
                Ok(ip) => Host::Ip(ip.to_canonical()),
                Err(_) => Host::Name(raw.trim_end_matches('.').to_ascii_lowercase()),
            },
        };
        let port = url.port_or_known_default().unwrap_or(0);
        let listed = self
            .entries
            .iter()
            .any(|entry| entry.host == host && entry.port.is_none_or(|allowed| allowed == port));
        let internal = matches!(host, Host::Ip(ip) if is_internal(ip));
        if listed || (self.any_public && !internal) {
            return Ok(());
        }
        Err(EgressError::NotAllowed {
            host_port: format!("{raw}:{port}"),
            internal,
        })
    }

    /// A resolver for a reqwest client that keeps only the addresses allowed; a name with none
    /// fails to resolve with an error [`refused`] recognizes.
    pub fn resolver(self: &Arc<Self>) -> Arc<dyn reqwest::dns::Resolve> {
        Arc::new(Resolver {
            egress: Arc::clone(self),
        })
    }
}

/// An entry of an allow list, or why it is not one.
fn parse_entry(text: &str) -> Result<Entry, String> {
    let text = text.trim();
    let bad = || {
        format!(
            "host `{text}` is not HOST, HOST:PORT or [IPV6]:PORT (for example example.com or 127.0.0.1:9000)"
        )
    };
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(bad)?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':').ok_or_else(bad)?)),
        }
    } else {
        match text.split_once(':') {
            Some((host, port)) if !port.contains(':') => (host, Some(port)),
            // A bare IPv6 address, without a port.
            _ => (text, None),
        }
    };
    let port = port
        .map(|port| port.parse::<u16>().map_err(|_| bad()))
        .transpose()?;
    if host.is_empty() || host.contains(['/', '@', '?', '#', ' ']) {
        return Err(bad());
    }
    let host = match host.parse::<IpAddr>() {
        Ok(ip) => Host::Ip(ip.to_canonical()),
        Err(_) if host.contains(':') => return Err(bad()),
        Err(_) => Host::Name(host.trim_end_matches('.').to_ascii_lowercase()),
    };
    Ok(Entry { host, port })
}

/// Whether `ip` is internal: loopback, private, link-local, unspecified, shared (CGNAT),
/// multicast, broadcast, documentation and reserved ranges, and their IPv6 counterparts.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (b & 0xc0) == 64)
                || (a == 198 && (b & 0xfe) == 18)
                || a >= 240
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            v6.is_multicast()
                // ::/96: unspecified, loopback, IPv4-compatible.
                || s[..6].iter().all(|&segment| segment == 0)
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] == 0x64 && s[1] == 0xff9b)
                || (s[0] == 0x2001 && s[1] == 0x0db8)
        }
    }
}

struct Resolver {
    egress: Arc<Egress>,
}

/// A host that resolves to no address that may be reached.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{0}` resolves to no address that may be reached (private, loopback and link-local addresses only when listed)"
)]
struct Refused(String);

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let egress = Arc::clone(&self.egress);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|address| egress.address_allowed(address.ip()))
                .collect();
            if allowed.is_empty() {
                return Err(Box::new(Refused(host)) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Whether `error` came from an [`Egress`] resolver refusing every address of a host.
pub fn refused(error: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(cause) = source {
        if cause.is::<Refused>() {
            return true;
        }
        source = cause.source();
    }
    false
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn listed(hosts: &[&str]) -> Egress {
        Egress::new(&hosts.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn hosts_are_allowed_when_listed_and_internal_addresses_only_by_address() {
        let egress = listed(&["hooks.example.com", "127.0.0.1:9000", "[::1]:8080"]);
        assert!(egress.check("https://hooks.example.com/x").is_ok());
        assert!(egress.check("http://hooks.example.com:1234/x").is_ok());
        assert!(egress.check("http://127.0.0.1:9000/").is_ok());
        assert!(egress.check("http://[::1]:8080/").is_ok());
        assert!(matches!(
            egress.check("http://127.0.0.1:9001/"),
            Err(EgressError::NotAllowed { internal: true, .. })
        ));
        assert!(matches!(
            egress.check("http://other.example.com/"),
            Err(EgressError::NotAllowed {
                internal: false,
                ..
            })
        ));
        assert!(matches!(
            egress.check("file:///etc/passwd"),
            Err(EgressError::Scheme(_))
        ));
        assert!(egress.address_allowed("127.0.0.1".parse().unwrap()));
        assert!(!egress.address_allowed("10.0.0.1".parse().unwrap()));
        assert!(egress.address_allowed("93.184.216.34".parse().unwrap()));
        assert!(Egress::new(&["bad host".to_owned()]).is_err());
    }

    #[test]
    fn public_means_every_public_host_and_no_internal_one_unless_listed() {
        let egress = Egress::public_and(&[]).unwrap();
        assert!(egress.check("https://example.com/").is_ok());
        for internal in [
            "http://127.0.0.1/",
            "http://10.1.2.3/",
            "http://169.254.169.254/latest/meta-data",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://0.0.0.0/",
            "http://100.64.0.1/",
        ] {
            assert!(
                matches!(
                    egress.check(internal),
                    Err(EgressError::NotAllowed { internal: true, .. })
                ),
                "{internal}"
            );
        }
        let lab = Egress::public_and(&["10.1.2.3".to_owned()]).unwrap();
        assert!(lab.check("http://10.1.2.3:8080/").is_ok());
        assert!(lab.address_allowed("10.1.2.3".parse().unwrap()));
        assert!(!lab.address_allowed("10.1.2.4".parse().unwrap()));
    }
}
