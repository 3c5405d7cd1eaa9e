//! `fetch_url`: the model reads a web page (or any text) at an `http` or `https` address.
//!
//! HTML comes back as its readable text (scripts, styles and markup dropped, blocks on lines
//! of their own); other text as it is. Anything else is refused by content type. What is
//! returned is capped (`max_chars`), the rest said so.

use std::time::Duration;

use deepagents_core::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

/// The tool's name.
pub const FETCH_URL: &str = "fetch_url";

/// How long one fetch may take, redirects included.
const TIMEOUT: Duration = Duration::from_secs(30);
/// The most a page may weigh; more is cut before it is read.
const MAX_BYTES: usize = 5 * 1024 * 1024;
/// Characters returned unless the call asks for another number.
const DEFAULT_CHARS: usize = 20_000;
/// The most characters a call may ask for.
const MAX_CHARS: usize = 100_000;

/// `fetch_url`.
pub(crate) struct FetchUrl {
    client: reqwest::Client,
}

impl FetchUrl {
    /// The tool, with a client of its own (at most 5 redirects, a 30 s timeout).
    pub(crate) fn new() -> Result<Self, String> {
        let client = deepagents_models::http_client()
            .timeout(TIMEOUT)
            .redirect(reqwest::redirect::Policy::limited(5))
            .user_agent(concat!("deepagents/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot make the fetch_url client: {e}"))?;
        Ok(Self { client })
    }
}

/// Arguments of `fetch_url`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FetchUrlArgs {
    /// The address, `http://` or `https://`.
    url: String,
    /// How many characters of the page to return (default 20000, at most 100000).
    #[serde(default)]
    max_chars: Option<usize>,
}

impl Tool for FetchUrl {
    type Args = FetchUrlArgs;

    fn name(&self) -> &str {
        FETCH_URL
    }

    fn description(&self) -> String {
        format!(
            "Fetch a web page or text file by its http(s) URL and return its text: HTML as \
             readable text without markup, JSON and other text as is; images and other \
             binary content are refused. Returns at most max_chars characters (default \
             {DEFAULT_CHARS}, at most {MAX_CHARS}) and says when it cut the rest. Use it for \
             URLs the user gives or that you found, not to guess addresses."
        )
    }

    async fn call(&self, args: FetchUrlArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let refuse = |message: String| Err(ToolError::RespondToModel(message));
        let url = match reqwest::Url::parse(args.url.trim()) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => url,
            Ok(url) => {
                return refuse(format!(
                    "Only http and https URLs can be fetched, not {}:.",
                    url.scheme()
                ));
            }
            Err(error) => return refuse(format!("`{}` is not a URL: {error}.", args.url)),
        };
        let limit = args.max_chars.unwrap_or(DEFAULT_CHARS).clamp(1, MAX_CHARS);
        let mut response = match self.client.get(url.clone()).send().await {
            Ok(response) => response,
            Err(error) => return refuse(format!("Fetching {url} failed: {error}.")),
        };
        let status = response.status();
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
                Err(error) => return refuse(format!("Reading {url} failed: {error}.")),
            }
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let excerpt: String = plain(&text, &content_type).chars().take(500).collect();
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
                "{url} is {content_type}, not text: fetch_url reads web pages and text only."
            ));
        }
        let text = plain(&String::from_utf8_lossy(&body), &content_type);
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
        Ok(ToolOutput::text(format!(
            "{url} ({status}, {}):\n\n{shown}",
            if content_type.is_empty() {
                "no content type"
            } else {
                content_type.split(';').next().unwrap_or_default()
            }
        )))
    }
}

/// The readable text of `body`: HTML without markup, other text unchanged.
fn plain(body: &str, content_type: &str) -> String {
    let html = content_type.contains("html")
        || (content_type.is_empty() && body.trim_start().starts_with('<'));
    if html {
        html_text(body)
    } else {
        body.to_owned()
    }
}

/// HTML as text: scripts, styles and comments dropped, tags removed, blocks on lines of
/// their own, the common entities decoded, blank lines dropped.
fn html_text(html: &str) -> String {
    let mut text = String::with_capacity(html.len() / 2);
    let lower = html.to_ascii_lowercase();
    let mut at = 0;
    while let Some(offset) = html[at..].find('<') {
        let start = at + offset;
        text.push_str(&decode(&html[at..start]));
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
        let tag = &lower[start + 1..start + gt];
        let name = tag
            .trim_start_matches('/')
            .split(|c: char| c.is_whitespace() || c == '/')
            .next()
            .unwrap_or_default();
        if matches!(
            name,
            "p" | "div"
                | "br"
                | "li"
                | "tr"
                | "h1"
                | "h2"
                | "h3"
                | "h4"
                | "h5"
                | "h6"
                | "section"
                | "article"
                | "header"
                | "footer"
                | "pre"
                | "blockquote"
                | "table"
                | "ul"
                | "ol"
                | "title"
        ) {
            text.push('\n');
        } else if matches!(name, "td" | "th") {
            text.push(' ');
        }
        at = start + gt + 1;
    }
    text.push_str(&decode(&html[at..]));
    text.lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
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
    use super::*;

    #[test]
    fn html_becomes_readable_text() {
        let page = "<!doctype html><html><head><title>T</title><style>p{color:red}</style></head>\
            <body><script>alert('x')</script><h1>Release&nbsp;notes</h1><!-- hidden -->\
            <p>Fixed <b>three</b> bugs &amp; added <a href='/x'>one</a> feature.</p>\
            <ul><li>first</li><li>second &#x263A;</li></ul></body></html>";
        let text = html_text(page);
        assert_eq!(
            text,
            "Release notes\nFixed three bugs & added one feature.\nfirst\nsecond \u{263A}"
        );
    }
}
