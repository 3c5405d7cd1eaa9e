//! `web_fetch`: the model reads a web page (or any text) at an `http` or `https` address.
//!
//! HTML comes back as Markdown (headings, links, lists, emphasis, code; scripts, styles and
//! markup dropped); other text as it is. Anything else is refused by content type. What is
//! returned is capped (`max_chars`), the rest said so. Only public addresses are reached,
//! and the internal ones the operator lists: the URL, every redirect and every address a
//! name resolves to are checked ([`Egress`]).

use std::sync::Arc;
use std::time::Duration;

use deepagents_core::{Tool, ToolContext, ToolError, ToolOutput};
use deepagents_models::egress::{self, Egress};
use schemars::JsonSchema;
use serde::Deserialize;

/// The tool's name.
pub const WEB_FETCH: &str = "web_fetch";

/// How long one fetch may take, redirects included.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Redirects followed before giving up.
const MAX_REDIRECTS: usize = 5;
/// The most a page may weigh; more is cut before it is read.
const MAX_BYTES: usize = 5 * 1024 * 1024;
/// Characters returned unless the call asks for another number.
const DEFAULT_CHARS: usize = 20_000;
/// The most characters a call may ask for.
const MAX_CHARS: usize = 100_000;

/// `web_fetch`.
pub(crate) struct WebFetch {
    client: reqwest::Client,
    egress: Arc<Egress>,
}

impl WebFetch {
    /// The tool, reaching public hosts and the internal ones `allowed_hosts` lists
    /// (`host`, `host:port`, `ip`, `ip:port`).
    pub(crate) fn new(allowed_hosts: &[String]) -> Result<Self, String> {
        let egress =
            Arc::new(Egress::public_and(allowed_hosts).map_err(|why| format!("web_fetch: {why}"))?);
        let checked = Arc::clone(&egress);
        let redirects = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
            } else if let Err(why) = checked.check_url(attempt.url()) {
                let target = attempt.url().to_string();
                attempt.error(format!("a redirect to {target}: {why}"))
            } else {
                attempt.follow()
            }
        });
        let client = deepagents_models::http_client()
            .timeout(TIMEOUT)
            .redirect(redirects)
            .dns_resolver(egress.resolver())
            .no_proxy()
            .user_agent(concat!("deepagents/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot make the web_fetch client: {e}"))?;
        Ok(Self { client, egress })
    }
}

/// Arguments of `web_fetch`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WebFetchArgs {
    /// The address, `http://` or `https://`.
    url: String,
    /// How many characters of the page to return (default 20000, at most 100000).
    #[serde(default)]
    max_chars: Option<usize>,
}

impl Tool for WebFetch {
    type Args = WebFetchArgs;

    fn name(&self) -> &str {
        WEB_FETCH
    }

    fn description(&self) -> String {
        format!(
            "Fetch a web page or text file by its http(s) URL and return its content: HTML as \
             Markdown, JSON and other text as is; images and other binary content are refused. \
             Returns at most max_chars characters (default {DEFAULT_CHARS}, at most \
             {MAX_CHARS}) and says when it cut the rest. Private and local addresses are not \
             reachable. Use it for URLs the user gives or that you found, not to guess \
             addresses."
        )
    }

    async fn call(&self, args: WebFetchArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let refuse = |message: String| Err(ToolError::RespondToModel(message));
        let url = match self.egress.check(args.url.trim()) {
            Ok(url) => url,
            Err(why) => return refuse(format!("Cannot fetch `{}`: {why}.", args.url)),
        };
        let limit = args.max_chars.unwrap_or(DEFAULT_CHARS).clamp(1, MAX_CHARS);
        let mut response = match self.client.get(url.clone()).send().await {
            Ok(response) => response,
            Err(error) if egress::refused(&error) => {
                return refuse(format!(
                    "Cannot fetch {url}: its host resolves only to private or local addresses, which are not reachable."
                ));
            }
            Err(error) => return refuse(format!("Fetching {url} failed: {}.", causes(error))),
        };
        let status = response.status();
        let final_url = response.url().clone();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let mut body = Vec::new();
        let mut truncated = false;
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let room = MAX_BYTES - body.len();
                    body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                    if chunk.len() > room {
                        truncated = true;
                        break;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    return refuse(format!("Reading {url} failed: {}.", causes(error)));
                }
            }
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let excerpt: String = readable(&text, &content_type, &final_url)
                .chars()
                .take(500)
                .collect();
            return refuse(format!(
                "{url} answered {status}.{}",
                if excerpt.trim().is_empty() {
                    String::new()
                } else {
                    format!(" It said: {}", excerpt.trim())
                }
            ));
        }
        let textual = content_type.is_empty()
            || content_type.starts_with("text/")
            || ["json", "xml", "javascript", "yaml", "toml", "csv"]
                .iter()
                .any(|kind| content_type.contains(kind));
        if !textual {
            return refuse(format!(
                "{url} is {content_type}, not text: web_fetch reads web pages and text only."
            ));
        }
        let text = readable(&String::from_utf8_lossy(&body), &content_type, &final_url);
        let total = text.chars().count();
        let mut shown: String = text.chars().take(limit).collect();
        if total > limit || truncated {
            shown.push_str(&format!(
                "\n\n[Cut: {limit} of {total} characters shown{}. Ask again with a larger max_chars (at most {MAX_CHARS}) to read more.]",
                if truncated {
                    format!("; the page was cut at {MAX_BYTES} bytes")
                } else {
                    String::new()
                }
            ));
        }
        let moved = if final_url == url {
            String::new()
        } else {
            format!(", redirected to {final_url}")
        };
        Ok(ToolOutput::text(format!(
            "{url} ({status}{moved}, {}):\n\n{shown}",
            if content_type.is_empty() {
                "no content type"
            } else {
                content_type.split(';').next().unwrap_or_default()
            }
        )))
    }
}

/// What went wrong, with its causes (reqwest's own message leaves out why a redirect or a
/// connection failed).
fn causes(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The readable content of `body`: HTML as Markdown (links resolved against `base`), other
/// text unchanged.
fn readable(body: &str, content_type: &str, base: &reqwest::Url) -> String {
    let html = content_type.contains("html")
        || (content_type.is_empty() && body.trim_start().starts_with('<'));
    if html {
        html_markdown(body, base)
    } else {
        body.to_owned()
    }
}

/// HTML as Markdown: headings as `#`, paragraphs and blocks apart, links as `[text](url)`,
/// list items as `-` or `1.`, `**bold**`, `*emphasis*`, `` `code` `` and fenced `pre` blocks;
/// scripts, styles, comments and the rest of the markup dropped, entities decoded, runs of
/// blank lines squeezed to one. A converter this small misses what tables and nested layouts
/// mean; it keeps their text.
fn html_markdown(html: &str, base: &reqwest::Url) -> String {
    let mut out = String::with_capacity(html.len() / 2);
    let lower = html.to_ascii_lowercase();
    let mut links: Vec<Option<String>> = Vec::new();
    let mut lists: Vec<Option<usize>> = Vec::new();
    let mut pre = 0usize;
    let mut at = 0;
    let text = |out: &mut String, raw: &str, pre: bool| {
        let decoded = decode(raw);
        if pre {
            out.push_str(&decoded);
            return;
        }
        let mut words = decoded.split_whitespace().peekable();
        if words.peek().is_none() {
            if !decoded.is_empty() && !out.ends_with([' ', '\n']) {
                out.push(' ');
            }
            return;
        }
        if decoded.starts_with(char::is_whitespace) && !out.ends_with([' ', '\n']) {
            out.push(' ');
        }
        let joined = words.collect::<Vec<_>>().join(" ");
        out.push_str(&joined);
        if decoded.ends_with(char::is_whitespace) {
            out.push(' ');
        }
    };
    while let Some(offset) = html[at..].find('<') {
        let start = at + offset;
        text(&mut out, &html[at..start], pre > 0);
        // A comment, or an element whose content is not text, is skipped whole.
        let skip_to = if lower[start..].starts_with("<!--") {
            lower[start..].find("-->").map(|end| start + end + 3)
        } else {
            ["script", "style", "noscript", "template", "svg", "head"]
                .iter()
                .find(|name| {
                    lower[start + 1..].starts_with(*name)
                        && lower[start + 1 + name.len()..]
                            .starts_with(|c: char| c == '>' || c.is_whitespace())
                })
                .and_then(|name| {
                    let close = format!("</{name}");
                    lower[start..].find(&close).and_then(|end| {
                        lower[start + end..]
                            .find('>')
                            .map(|gt| start + end + gt + 1)
                    })
                })
        };
        if let Some(end) = skip_to {
            at = end;
            continue;
        }
        let Some(gt) = html[start..].find('>') else {
            at = start + 1;
            continue;
        };
        let tag = &html[start + 1..start + gt];
        let closing = tag.starts_with('/');
        let name = lower[start + 1..start + gt]
            .trim_start_matches('/')
            .split(|c: char| c.is_whitespace() || c == '/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let block = |out: &mut String| {
            if !out.is_empty() && !out.ends_with("\n\n") {
                out.push_str(if out.ends_with('\n') { "\n" } else { "\n\n" });
            }
        };
        match (name.as_str(), closing) {
            (heading @ ("h1" | "h2" | "h3" | "h4" | "h5" | "h6"), false) => {
                block(&mut out);
                let level = usize::from(heading.as_bytes()[1] - b'0');
                out.push_str(&"#".repeat(level));
                out.push(' ');
            }
            ("h1" | "h2" | "h3" | "h4" | "h5" | "h6", true)
            | (
                "p" | "div" | "section" | "article" | "header" | "footer" | "main" | "nav"
                | "aside" | "table" | "blockquote" | "figure" | "form",
                _,
            ) => block(&mut out),
            ("br", _) | ("tr", true) => out.push('\n'),
            ("ul", false) => {
                block(&mut out);
                lists.push(None);
            }
            ("ol", false) => {
                block(&mut out);
                lists.push(Some(0));
            }
            ("ul" | "ol", true) => {
                lists.pop();
                block(&mut out);
            }
            ("li", false) => {
                if !out.is_empty() && !out.ends_with('\n') {
                    out.push('\n');
                }
                out.push_str(&"  ".repeat(lists.len().saturating_sub(1)));
                match lists.last_mut() {
                    Some(Some(n)) => {
                        *n += 1;
                        out.push_str(&format!("{n}. "));
                    }
                    _ => out.push_str("- "),
                }
            }
            ("td" | "th", false) => out.push_str(" | "),
            ("strong" | "b", _) => out.push_str("**"),
            ("em" | "i", _) => out.push('*'),
            ("code", _) if pre == 0 => out.push('`'),
            ("pre", false) => {
                block(&mut out);
                out.push_str("```\n");
                pre += 1;
            }
            ("pre", true) => {
                pre = pre.saturating_sub(1);
                if !out.ends_with('\n') {
                    out.push('\n');
                }
                out.push_str("```\n\n");
            }
            ("a", false) => {
                let href = attribute(tag, "href")
                    .filter(|href| !href.starts_with('#') && !href.starts_with("javascript:"))
                    .and_then(|href| base.join(&decode(&href)).ok())
                    .map(|url| url.to_string());
                if href.is_some() {
                    out.push('[');
                }
                links.push(href);
            }
            ("a", true) => {
                if let Some(Some(href)) = links.pop() {
                    let trimmed = out.trim_end().len();
                    out.truncate(trimmed);
                    out.push_str(&format!("]({href})"));
                }
            }
            ("img", _) => {
                if let Some(alt) = attribute(tag, "alt").filter(|alt| !alt.trim().is_empty()) {
                    out.push_str(&format!("[image: {}]", decode(alt.trim())));
                }
            }
            _ => {}
        }
        at = start + gt + 1;
    }
    text(&mut out, &html[at..], pre > 0);
    // Lines trimmed (but code kept as written), blank runs squeezed.
    let mut lines: Vec<String> = Vec::new();
    let mut code = false;
    for line in out.lines() {
        if line.trim_start().starts_with("```") {
            code = !code;
            lines.push(line.trim().to_owned());
            continue;
        }
        let line = if code { line.trim_end() } else { line.trim() };
        if line.is_empty() && lines.last().is_none_or(String::is_empty) {
            continue;
        }
        lines.push(line.to_owned());
    }
    while lines.last().is_some_and(String::is_empty) {
        lines.pop();
    }
    lines.join("\n")
}

/// The value of attribute `name` in a tag's text (`a href="…" class=x`), quoted or not.
fn attribute(tag: &str, name: &str) -> Option<String> {
    let lower = tag.to_ascii_lowercase();
    let mut from = 0;
    while let Some(found) = lower[from..].find(name) {
        let at = from + found;
        from = at + name.len();
        let before_ok = at == 0 || lower.as_bytes()[at - 1].is_ascii_whitespace();
        let rest = lower[from..].trim_start();
        if !before_ok || !rest.starts_with('=') {
            continue;
        }
        let value_at = tag.len() - tag[from..].trim_start().len() + 1;
        let value = tag[value_at..].trim_start();
        return Some(match value.chars().next() {
            Some(quote @ ('"' | '\'')) => value[1..]
                .split(quote)
                .next()
                .unwrap_or_default()
                .to_owned(),
            _ => value
                .split(|c: char| c.is_whitespace() || c == '>')
                .next()
                .unwrap_or_default()
                .to_owned(),
        });
    }
    None
}

/// Decodes the common HTML entities (named and numeric); others stay as written.
fn decode(text: &str) -> String {
    if !text.contains('&') {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let Some(semi) = rest[..rest.len().min(12)].find(';') else {
            out.push('&');
            rest = &rest[1..];
            continue;
        };
        let entity = &rest[1..semi];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" | "#39" => Some('\''),
            "nbsp" => Some(' '),
            _ => entity
                .strip_prefix("#x")
                .or_else(|| entity.strip_prefix("#X"))
                .and_then(|hex| u32::from_str_radix(hex, 16).ok())
                .or_else(|| entity.strip_prefix('#').and_then(|dec| dec.parse().ok()))
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn html_becomes_markdown() {
        let page = "<!doctype html><html><head><title>T</title><style>p{color:red}</style></head>\
            <body><script>alert('x')</script><h1>Release&nbsp;notes</h1><!-- hidden -->\
            <p>Fixed <b>three</b> bugs &amp; added <a href='/x?a=1&amp;b=2'>one</a> feature.</p>\
            <ul><li>first</li><li>second &#x263A;</li></ul><ol><li>a</li><li>b</li></ol>\
            <pre>fn main() {\n    run();\n}</pre><p>Use <code>cargo test</code>.</p></body></html>";
        let base = reqwest::Url::parse("https://example.com/docs/page").unwrap();
        assert_eq!(
            html_markdown(page, &base),
            "# Release notes\n\nFixed **three** bugs & added [one](https://example.com/x?a=1&b=2) feature.\n\n- first\n- second \u{263A}\n\n1. a\n2. b\n\n```\nfn main() {\n    run();\n}\n```\n\nUse `cargo test`."
        );
    }
}
