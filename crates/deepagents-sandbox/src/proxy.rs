//! The network proxy of [`Network::Domains`](crate::Network::Domains): an HTTP proxy on a
//! Unix socket outside the sandbox that lets through requests to allowed domains only.
//!
//! It speaks `CONNECT host:port` (HTTPS and any TLS) and plain HTTP requests in absolute form
//! (`GET http://host/path`); anything else is answered `400`. A host that no rule allows is
//! answered `403` with the reason, and remembered so the caller can tell the agent. The
//! sandbox has no network of its own: the [`helper`](crate::helper) listens on
//! `127.0.0.1:3128` inside it and hands each connection to this socket, and commands find it
//! through `HTTP_PROXY`/`HTTPS_PROXY`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The port the proxy answers on inside the sandbox.
pub const PORT_INSIDE: u16 = 3128;

/// The longest request head the proxy reads.
const MAX_HEAD: usize = 16 * 1024;

/// How long the proxy waits for a request head or a connection to the destination.
const TIMEOUT: Duration = Duration::from_secs(15);

/// Which hosts a request may reach.
///
/// A rule is a domain (`example.com`: that name only), a wildcard (`*.example.com`: its
/// subdomains, not the name itself), or an IP address. Names are compared without case and
/// without a trailing dot. After resolution, addresses on this machine or its private
/// networks (loopback, private, link-local, unspecified) are refused for names a wildcard
/// allowed, so a subdomain someone else controls cannot point into the host; a name or
/// address listed exactly is the user's explicit choice and reaches wherever it resolves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DomainRules {
    exact: Vec<String>,
    suffixes: Vec<String>,
}

/// How a host matched the rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Match {
    /// Listed exactly.
    Exact,
    /// Allowed by a wildcard: local addresses refused after resolution.
    Wildcard,
}

impl DomainRules {
    /// Rules from entries as the configuration lists them.
    pub fn new<S: AsRef<str>>(entries: &[S]) -> Self {
        let mut rules = Self::default();
        for entry in entries {
            let entry = normalize(entry.as_ref());
            match entry.strip_prefix("*.") {
                Some(suffix) if !suffix.is_empty() => rules.suffixes.push(format!(".{suffix}")),
                _ if !entry.is_empty() => rules.exact.push(entry),
                _ => {}
            }
        }
        rules
    }

    /// Whether `host` may be reached, and how it matched.
    pub fn matches(&self, host: &str) -> Option<Match> {
        let host = normalize(host);
        if self.exact.contains(&host) {
            return Some(Match::Exact);
        }
        // An IP address is never matched by a wildcard.
        let is_address = host.parse::<IpAddr>().is_ok();
        (!is_address
            && self
                .suffixes
                .iter()
                .any(|suffix| host.ends_with(suffix.as_str())))
        .then_some(Match::Wildcard)
    }
}

fn normalize(host: &str) -> String {
    host.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

/// Whether `ip` is on this machine or a private network.
pub fn is_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.octets()[0] == 0
                || (v4.octets()[0] == 100 && (v4.octets()[1] & 0xc0) == 64)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_local(IpAddr::V4(v4));
            }
            v6.is_loopback()
                || v6.is_unspecified()
                || (v6.segments()[0] & 0xfe00) == 0xfc00
                || (v6.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

/// A running proxy: its socket, the hosts it refused. Stops accepting when dropped.
#[derive(Debug)]
pub struct Proxy {
    dir: PathBuf,
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    refused: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    /// Starts a proxy for `rules` on a new socket in a private directory of the host's
    /// temporary directory.
    pub fn start(rules: DomainRules) -> std::io::Result<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "deepagents-proxy-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir)?;
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let socket = dir.join("proxy.sock");
        let listener = UnixListener::bind(&socket)?;
        let stop = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(Mutex::new(Vec::new()));
        let rules = Arc::new(rules);
        {
            let (stop, refused) = (Arc::clone(&stop), Arc::clone(&refused));
            std::thread::Builder::new()
                .name("sandbox-proxy".to_owned())
                .spawn(move || {
                    for stream in listener.incoming() {
                        if stop.load(Ordering::Acquire) {
                            break;
                        }
                        let Ok(stream) = stream else { continue };
                        let (rules, refused) = (Arc::clone(&rules), Arc::clone(&refused));
                        let _ = std::thread::Builder::new()
                            .name("sandbox-proxy-conn".to_owned())
                            .spawn(move || serve(stream, &rules, &refused));
                    }
                })?;
        }
        Ok(Self {
            dir,
            socket,
            stop,
            refused,
        })
    }

    /// The proxy's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The directory holding the socket (what the sandbox mounts).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Hosts refused so far, each once, in the order they were asked for.
    pub fn refused(&self) -> Vec<String> {
        self.refused
            .lock()
            .map(|hosts| hosts.clone())
            .unwrap_or_default()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept loop so it sees the flag.
        let _ = UnixStream::connect(&self.socket);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One client connection: read the request head, check the host, connect, relay.
fn serve(client: UnixStream, rules: &DomainRules, refused: &Mutex<Vec<String>>) {
    let _ = client.set_read_timeout(Some(TIMEOUT));
    let Ok(reader_half) = client.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(reader_half);
    let mut writer = client;
    let head = match read_head(&mut reader) {
        Ok(head) => head,
        Err(reason) => return answer(&mut writer, 400, &reason),
    };
    let request = match Request::parse(&head) {
        Ok(request) => request,
        Err(reason) => return answer(&mut writer, 400, &reason),
    };
    let Some(how) = rules.matches(&request.host) else {
        if let Ok(mut hosts) = refused.lock()
            && !hosts.contains(&request.host)
        {
            hosts.push(request.host.clone());
        }
        return answer(
            &mut writer,
            403,
            &format!(
                "the sandbox does not allow {}: it is not in the allowed domains",
                request.host
            ),
        );
    };
    let upstream = match connect(&request.host, request.port, how) {
        Ok(upstream) => upstream,
        Err(reason) => return answer(&mut writer, 502, &reason),
    };
    let _ = writer.set_read_timeout(None);
    if request.method == "CONNECT" {
        if writer
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .is_err()
        {
            return;
        }
    } else if (&upstream)
        .write_all(request.origin_form_head().as_bytes())
        .is_err()
    {
        return;
    }
    // Whatever the client sent after the head (a body, TLS bytes) goes first.
    if !reader.buffer().is_empty() && (&upstream).write_all(reader.buffer()).is_err() {
        return;
    }
    drop(reader);
    splice(writer, upstream);
}

/// Copies between two streams both ways until both are done (the helper's bridge).
pub fn splice<A, B>(a: A, b: B)
where
    A: Read + Write + TryCloneStream + Send + 'static,
    B: Read + Write + TryCloneStream + Send + 'static,
{
    let (Ok(mut a_reader), Ok(mut b_reader)) = (a.try_clone_stream(), b.try_clone_stream()) else {
        return;
    };
    let (mut a_writer, mut b_writer) = (a, b);
    let upload = std::thread::spawn(move || {
        let _ = std::io::copy(&mut a_reader, &mut b_writer);
        b_writer.shutdown_write();
    });
    let _ = std::io::copy(&mut b_reader, &mut a_writer);
    a_writer.shutdown_write();
    let _ = upload.join();
}

/// A socket that can be cloned and half-closed.
pub trait TryCloneStream: Sized {
    /// Another handle to the same socket.
    fn try_clone_stream(&self) -> std::io::Result<Self>;
    /// Closes the writing half, telling the peer nothing more comes.
    fn shutdown_write(&self);
}

impl TryCloneStream for TcpStream {
    fn try_clone_stream(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn shutdown_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

impl TryCloneStream for UnixStream {
    fn try_clone_stream(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn shutdown_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

/// The destination's first address that accepts a connection, refusing local addresses for
/// a wildcard match.
fn connect(host: &str, port: u16, how: Match) -> Result<TcpStream, String> {
    let addresses: Vec<SocketAddr> = (normalize(host).as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    let allowed: Vec<SocketAddr> = addresses
        .iter()
        .copied()
        .filter(|address| how == Match::Exact || !is_local(address.ip()))
        .collect();
    if allowed.is_empty() {
        return Err(format!(
            "the sandbox does not allow {host}: it resolves to an address on this machine or a private network"
        ));
    }
    let mut last = String::new();
    for address in allowed {
        match TcpStream::connect_timeout(&address, TIMEOUT) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = format!("cannot connect to {host} ({address}): {e}"),
        }
    }
    Err(last)
}

fn read_head(reader: &mut BufReader<UnixStream>) -> Result<Vec<String>, String> {
    let mut lines = Vec::new();
    let mut total = 0;
    loop {
        let mut line = String::new();
        let read = reader
            .read_line(&mut line)
            .map_err(|e| format!("cannot read the request: {e}"))?;
        total += read;
        if read == 0 || total > MAX_HEAD {
            return Err("the request head is incomplete or too long".to_owned());
        }
        let line = line.trim_end_matches(['\r', '\n']).to_owned();
        if line.is_empty() {
            return Ok(lines);
        }
        lines.push(line);
    }
}

struct Request {
    method: String,
    host: String,
    port: u16,
    /// The path and query of a plain HTTP request.
    path: String,
    version: String,
    headers: Vec<String>,
}

impl Request {
    fn parse(head: &[String]) -> Result<Self, String> {
        let first = head.first().ok_or("an empty request")?;
        let mut parts = first.split_whitespace();
        let (Some(method), Some(target), Some(version)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("not an HTTP request line: {first}"));
        };
        let headers = head[1..].to_vec();
        if method.eq_ignore_ascii_case("CONNECT") {
            let (host, port) = split_host_port(target, 443)?;
            return Ok(Self {
                method: "CONNECT".to_owned(),
                host,
                port,
                path: String::new(),
                version: version.to_owned(),
                headers,
            });
        }
        let rest = target.strip_prefix("http://").ok_or_else(|| {
            format!("the proxy takes CONNECT or absolute http:// requests, not {target}")
        })?;
        let (authority, path) = match rest.find('/') {
            Some(slash) => (&rest[..slash], &rest[slash..]),
            None => (rest, "/"),
        };
        let authority = authority.rsplit('@').next().unwrap_or(authority);
        let (host, port) = split_host_port(authority, 80)?;
        Ok(Self {
            method: method.to_owned(),
            host,
            port,
            path: path.to_owned(),
            version: version.to_owned(),
            headers,
        })
    }

    /// The head to send the origin server: origin-form target, no proxy headers, one
    /// request per connection (a second request could name another host).
    fn origin_form_head(&self) -> String {
        let mut head = format!("{} {} {}\r\n", self.method, self.path, self.version);
        for header in &self.headers {
            let name = header.split(':').next().unwrap_or("").trim();
            if name.to_ascii_lowercase().starts_with("proxy-")
                || name.eq_ignore_ascii_case("connection")
                || name.eq_ignore_ascii_case("keep-alive")
            {
                continue;
            }
            head.push_str(header);
            head.push_str("\r\n");
        }
        head.push_str("Connection: close\r\n\r\n");
        head
    }
}

fn split_host_port(authority: &str, default_port: u16) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("a malformed address: {authority}"))?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(port) => port
            .parse()
            .map_err(|_| format!("a malformed port in {authority}"))?,
        None => default_port,
    };
    if host.is_empty() {
        return Err(format!("no host in {authority}"));
    }
    Ok((normalize(host), port))
}

fn answer(writer: &mut UnixStream, status: u16, reason: &str) {
    let title = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        _ => "Bad Gateway",
    };
    let body = format!("{reason}\n");
    let _ = write!(
        writer,
        "HTTP/1.1 {status} {title}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_names_wildcards_and_addresses() {
        let rules = DomainRules::new(&["Example.com.", "*.pypi.org", "10.0.0.1", "*."]);
        assert_eq!(rules.matches("example.com"), Some(Match::Exact));
        assert_eq!(rules.matches("EXAMPLE.COM"), Some(Match::Exact));
        assert_eq!(rules.matches("www.example.com"), None);
        assert_eq!(rules.matches("files.pypi.org"), Some(Match::Wildcard));
        assert_eq!(rules.matches("pypi.org"), None);
        assert_eq!(rules.matches("evilpypi.org"), None);
        assert_eq!(rules.matches("10.0.0.1"), Some(Match::Exact));
        assert_eq!(rules.matches("127.0.0.1"), None);
    }

    #[test]
    fn local_addresses_are_recognized() {
        for local in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "169.254.1.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(
                is_local(local.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))),
                "{local}"
            );
        }
        assert!(!is_local(IpAddr::from([93, 184, 216, 34])));
    }

    #[test]
    fn a_wildcard_match_never_reaches_a_local_address() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let port = listener.local_addr().map_or(0, |a| a.port());
        let refused = connect("localhost", port, Match::Wildcard)
            .err()
            .unwrap_or_default();
        assert!(refused.contains("private network"), "{refused}");
        assert!(connect("localhost", port, Match::Exact).is_ok());
    }

    #[test]
    fn requests_parse_and_lose_their_proxy_headers() {
        let head: Vec<String> = [
            "GET http://user@Example.com:8080/a?b HTTP/1.1",
            "Host: example.com:8080",
            "Proxy-Connection: keep-alive",
            "Accept: */*",
        ]
        .iter()
        .map(|line| (*line).to_owned())
        .collect();
        let request = Request::parse(&head).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((request.host.as_str(), request.port), ("example.com", 8080));
        assert_eq!(
            request.origin_form_head(),
            "GET /a?b HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let connect = Request::parse(&["CONNECT [::1]:443 HTTP/1.1".to_owned()])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((connect.host.as_str(), connect.port), ("::1", 443));
        assert!(Request::parse(&["GET /relative HTTP/1.1".to_owned()]).is_err());
    }
}
