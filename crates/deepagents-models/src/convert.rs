//! Conversions every wire format needs: tool arguments, binary content (sent when the API and
//! the model take it, replaced by a note otherwise), JSON schemas.

use std::borrow::Cow;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use deepagents_core::ContentBlock;
use deepagents_core::message::{ToolCall, Usage};
use deepagents_core::model::InputModalities;
use serde_json::{Map, Value};

/// Tool-call arguments from the JSON text a model produced. Empty text is `{}`; text that is
/// not JSON is kept verbatim as a string so the agent loop can tell the model.
pub fn parse_arguments(text: &str) -> Value {
    if text.trim().is_empty() {
        return Value::Object(Map::new());
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// Tool-call arguments as the JSON text providers expect back. Arguments that were cut or
/// malformed (kept as the model's raw text) go back as a valid object holding that text —
/// servers that parse the history (llama.cpp's, vLLM's) refuse invalid JSON there, and the
/// whole conversation would become unsendable.
/// Well-formed text goes back byte for byte, as the model wrote it.
pub fn arguments_text(call: &ToolCall) -> Cow<'_, str> {
    match &call.arguments {
        Value::String(raw)
            if serde_json::from_str::<Value>(raw).is_ok_and(|value| value.is_object()) =>
        {
            Cow::Borrowed(raw)
        }
        _ => Cow::Owned(arguments_object(call).to_string()),
    }
}

/// Tool-call arguments as an object, for providers that take them structured (Anthropic,
/// Gemini). Malformed text is wrapped so the history stays valid.
pub fn arguments_object(call: &ToolCall) -> Value {
    match &call.arguments {
        Value::Object(_) => call.arguments.clone(),
        Value::String(raw) => match serde_json::from_str::<Value>(raw) {
            Ok(value @ Value::Object(_)) => value,
            _ => serde_json::json!({ "_raw_arguments": raw }),
        },
        other => serde_json::json!({ "_arguments": other }),
    }
}

/// `data:` URL of binary content.
pub fn data_url(mime_type: &str, data: &[u8]) -> String {
    format!("data:{mime_type};base64,{}", STANDARD.encode(data))
}

/// Base64 of binary content.
pub fn base64(data: &[u8]) -> String {
    STANDARD.encode(data)
}

/// A kind of binary content a model may read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Media {
    /// An image.
    Image,
    /// A PDF document.
    Pdf,
    /// An audio recording.
    Audio,
    /// A video.
    Video,
}

/// Formats of one kind an API takes.
#[derive(Clone, Copy, Debug)]
pub struct Formats {
    /// Accepted MIME types, lowercase, without parameters, by their registered names.
    pub mime_types: &'static [&'static str],
    /// The formats as a note names them, e.g. `PNG, JPEG, GIF or WebP`.
    pub names: &'static str,
}

/// What one API takes in the position a block is sent to; `None`: not that kind at all.
#[derive(Clone, Copy, Debug)]
pub struct ApiMedia {
    /// Images.
    pub images: Option<Formats>,
    /// Whether PDFs are taken.
    pub pdfs: bool,
    /// Audio.
    pub audio: Option<Formats>,
    /// Video.
    pub video: Option<Formats>,
}

/// How one content block travels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Carried<'a> {
    /// As text: a text block, text data decoded, or a note standing in for refused data.
    Text(Cow<'a, str>),
    /// As media the API and the model both take.
    Media {
        /// Its kind.
        kind: Media,
        /// Its MIME type: lowercase, without parameters, aliases under the registered name.
        mime_type: String,
        /// The bytes.
        data: &'a [u8],
    },
}

/// The image formats OpenAI's APIs take.
pub const OPENAI_IMAGES: Formats = Formats {
    mime_types: &["image/png", "image/jpeg", "image/webp", "image/gif"],
    names: "PNG, JPEG, WebP or GIF",
};

/// A position that takes text only, such as a system message.
pub const NO_MEDIA: ApiMedia = ApiMedia {
    images: None,
    pdfs: false,
    audio: None,
    video: None,
};

/// The text of `content` for a position that takes no media: text blocks as they are, text
/// data decoded, each other block a note on its own line.
pub fn text_with_notes(content: &[ContentBlock], model: InputModalities) -> String {
    text_and_media(content, &NO_MEDIA, model, false).0
}

/// `content` split for a position that takes text apart from media (a tool result on Chat
/// Completions or Gemini): the text, with text data decoded and a note on its own line for
/// each block that cannot go, and the media that can. `mark`: leave a line in the text where
/// each media block was, saying it follows in the next message.
pub fn text_and_media<'a>(
    content: &'a [ContentBlock],
    api: &ApiMedia,
    model: InputModalities,
    mark: bool,
) -> (String, Vec<Carried<'a>>) {
    let mut text = String::new();
    let mut media = Vec::new();
    for block in content {
        match carry(block, api, model) {
            // Text blocks join unseparated, as `joined_text` joins them, so text stays as sent.
            Some(Carried::Text(piece)) if matches!(block, ContentBlock::Text { .. }) => {
                text.push_str(&piece);
            }
            Some(Carried::Text(note)) => push_line(&mut text, &note),
            Some(carried @ Carried::Media { .. }) => {
                if mark
                    && let Carried::Media {
                        kind,
                        mime_type,
                        data,
                    } = &carried
                {
                    push_line(&mut text, &follows(*kind, mime_type, data.len()));
                }
                media.push(carried);
            }
            None => {}
        }
    }
    (text, media)
}

/// Appends `line` on a line of its own.
fn push_line(out: &mut String, line: &str) {
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(line);
}

/// How `block` travels to a model that reads `model` through an API that takes `api`;
/// `None` for reasoning, which is no input.
pub fn carry<'a>(
    block: &'a ContentBlock,
    api: &ApiMedia,
    model: InputModalities,
) -> Option<Carried<'a>> {
    match block {
        ContentBlock::Text { text } => Some(Carried::Text(Cow::Borrowed(text))),
        ContentBlock::Data { mime_type, data } => Some(carry_data(mime_type, data, api, model)),
        _ => None,
    }
}

fn carry_data<'a>(
    mime_type: &str,
    data: &'a [u8],
    api: &ApiMedia,
    model: InputModalities,
) -> Carried<'a> {
    let mime = essence(mime_type);
    if is_text_like(&mime) {
        // Every API takes text, so text files go as text rather than as a refused file.
        return Carried::Text(String::from_utf8_lossy(data));
    }
    let (kind, formats, readable) = if mime.starts_with("image/") {
        (Media::Image, api.images, model.images)
    } else if mime == "application/pdf" {
        let pdfs = api.pdfs.then_some(Formats {
            mime_types: &["application/pdf"],
            names: "PDF",
        });
        (Media::Pdf, pdfs, model.pdfs)
    } else if mime.starts_with("audio/") {
        (Media::Audio, api.audio, model.audio)
    } else if mime.starts_with("video/") {
        (Media::Video, api.video, model.video)
    } else {
        return Carried::Text(Cow::Owned(omitted_file(&mime, data.len())));
    };
    match formats {
        Some(formats) if readable && formats.mime_types.contains(&mime.as_str()) => {
            Carried::Media {
                kind,
                mime_type: mime,
                data,
            }
        }
        Some(formats) if readable => Carried::Text(Cow::Owned(wrong_format(
            kind,
            &mime,
            data.len(),
            formats.names,
        ))),
        _ => Carried::Text(Cow::Owned(unreadable(kind, &mime, data.len()))),
    }
}

/// A MIME type without parameters, lowercase, common aliases under their registered name:
/// `Audio/X-WAV; rate=8000` is `audio/wav`.
fn essence(mime_type: &str) -> String {
    let mime = mime_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let registered = match mime.as_str() {
        "image/jpg" | "image/pjpeg" => "image/jpeg",
        "audio/x-wav" | "audio/wave" | "audio/vnd.wave" => "audio/wav",
        "audio/mp3" | "audio/x-mp3" | "audio/mpeg3" => "audio/mpeg",
        "audio/x-flac" => "audio/flac",
        "audio/x-aiff" => "audio/aiff",
        "audio/x-aac" => "audio/aac",
        "application/x-pdf" => "application/pdf",
        _ => return mime,
    };
    registered.to_owned()
}

fn is_text_like(mime: &str) -> bool {
    mime.starts_with("text/")
        || matches!(
            mime,
            "application/json"
                | "application/xml"
                | "application/yaml"
                | "application/x-yaml"
                | "application/toml"
                | "application/javascript"
                | "application/x-sh"
        )
        || mime.ends_with("+json")
        || (mime.ends_with("+xml") && !mime.starts_with("image/"))
}

/// What a note calls a kind, with its article.
fn described(kind: Media) -> &'static str {
    match kind {
        Media::Image => "An image",
        Media::Pdf => "A PDF",
        Media::Audio => "Audio",
        Media::Video => "A video",
    }
}

/// `(what the model cannot do, what to ask for instead, a tool to try)`.
fn remedy(kind: Media) -> (&'static str, &'static str, &'static str) {
    match kind {
        Media::Image => (
            "view images",
            "a description of it",
            ", or extract any text in it with a tool",
        ),
        Media::Pdf => (
            "read PDFs",
            "its text",
            ", e.g. read it with a tool that extracts text",
        ),
        Media::Audio => ("listen to audio", "a transcript", ""),
        Media::Video => ("watch video", "a transcript or a description", ""),
    }
}

/// The note for media of a kind the model (or the API it is reached through) does not read.
pub fn unreadable(kind: Media, mime_type: &str, len: usize) -> String {
    let (cannot, instead, tool) = remedy(kind);
    format!(
        "[{} ({mime_type}, {}) was omitted: this model cannot {cannot}. Ask for {instead} instead{tool}.]",
        described(kind),
        size(len)
    )
}

/// The note for media of a kind the model reads, in a format its API refuses.
fn wrong_format(kind: Media, mime_type: &str, len: usize, accepted: &str) -> String {
    let (_, instead, _) = remedy(kind);
    let what = match kind {
        Media::Image => "images",
        Media::Pdf => "documents",
        Media::Audio => "audio",
        Media::Video => "video",
    };
    format!(
        "[{} ({mime_type}, {}) was omitted: this model takes {what} only as {accepted}. \
         Convert it to one of those with a tool, or ask for {instead} instead.]",
        described(kind),
        size(len)
    )
}

/// The note for binary data of no kind a model reads.
fn omitted_file(mime_type: &str, len: usize) -> String {
    format!(
        "[A file ({mime_type}, {}) was omitted: this model cannot read {mime_type} content. \
         Ask for a text version instead, e.g. convert it with a tool.]",
        size(len)
    )
}

/// The line that keeps a media block's place where the API takes only text, when the block
/// itself follows in the next message.
fn follows(kind: Media, mime_type: &str, len: usize) -> String {
    format!(
        "[{} ({mime_type}, {}) follows in the next message.]",
        described(kind),
        size(len)
    )
}

/// A byte count for people: `512 bytes`, `48 KB`, `2.1 MB`.
fn size(len: usize) -> String {
    const KB: usize = 1024;
    const MB: usize = 1024 * 1024;
    if len < KB {
        format!("{len} bytes")
    } else if len < MB {
        format!("{} KB", (len + KB / 2) / KB)
    } else {
        // Tenths of a megabyte, rounded, in integers: no float casts of a usize.
        let tenths = len.saturating_mul(10).saturating_add(MB / 2) / MB;
        format!("{}.{} MB", tenths / 10, tenths % 10)
    }
}

/// A JSON schema without the keys that only describe the document (`$schema`), with local
/// `$ref`s inlined, so providers that ignore definitions still see the whole shape.
pub fn inline_schema(schema: &Value) -> Value {
    let defs = schema
        .get("$defs")
        .or_else(|| schema.get("definitions"))
        .cloned()
        .unwrap_or(Value::Null);
    let mut out = resolve(schema, &defs, 0);
    if let Value::Object(map) = &mut out {
        map.remove("$schema");
        map.remove("$defs");
        map.remove("definitions");
        if !map.contains_key("type") {
            map.insert("type".to_owned(), Value::String("object".to_owned()));
        }
        if map.get("type").and_then(Value::as_str) == Some("object")
            && !map.contains_key("properties")
        {
            map.insert("properties".to_owned(), Value::Object(Map::new()));
        }
    }
    out
}

fn resolve(value: &Value, defs: &Value, depth: usize) -> Value {
    match value {
        Value::Object(map) => {
            if let Some(target) = map.get("$ref").and_then(Value::as_str)
                && depth < 16
            {
                let name = target.rsplit('/').next().unwrap_or_default();
                if let Some(found) = defs.get(name) {
                    let mut resolved = resolve(found, defs, depth + 1);
                    // Keys beside a $ref (e.g. a description) refine the definition.
                    if let Value::Object(resolved_map) = &mut resolved {
                        for (k, v) in map {
                            if k != "$ref" {
                                resolved_map.insert(k.clone(), resolve(v, defs, depth + 1));
                            }
                        }
                    }
                    return resolved;
                }
            }
            Value::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), resolve(v, defs, depth)))
                    .collect(),
            )
        }
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| resolve(v, defs, depth)).collect())
        }
        other => other.clone(),
    }
}

/// A token count from a JSON field, 0 when absent.
pub fn tokens(value: &Value, pointer: &str) -> u64 {
    value.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

/// Usage where `input` already includes `cached`.
pub fn usage(input: u64, output: u64, cached: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cached_input_tokens: cached,
        cache_write_input_tokens: 0,
    }
}

/// A fresh tool-call id for providers that do not give one.
pub fn new_call_id() -> String {
    format!("call_{:016x}", crate::http::random_u64())
}

#[cfg(test)]
mod tests {
    use deepagents_core::ContentBlock;
    use deepagents_core::model::InputModalities;

    use super::{size, text_with_notes};

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size(0), "0 bytes");
        assert_eq!(size(1023), "1023 bytes");
        assert_eq!(size(1024), "1 KB");
        assert_eq!(size(48 * 1024 + 600), "49 KB");
        assert_eq!(size(1024 * 1024), "1.0 MB");
        assert_eq!(size(2_200_000), "2.1 MB");
        assert!(size(usize::MAX).ends_with(" MB"));
    }

    #[test]
    fn text_positions_keep_text_decode_text_files_and_note_the_rest() {
        let content = [
            ContentBlock::text("Read "),
            ContentBlock::text("this:"),
            ContentBlock::data("Text/Plain; charset=utf-8", b"hello".to_vec()),
            ContentBlock::data("image/jpg", vec![0; 2048]),
            ContentBlock::Reasoning {
                text: "hidden".into(),
                signature: None,
                opaque: None,
            },
        ];
        assert_eq!(
            text_with_notes(&content, InputModalities::ALL),
            "Read this:\nhello\n[An image (image/jpeg, 2 KB) was omitted: this model cannot \
             view images. Ask for a description of it instead, or extract any text in it with \
             a tool.]"
        );
    }
}
