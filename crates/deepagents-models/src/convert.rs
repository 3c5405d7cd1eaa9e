//! Conversions every wire format needs: tool arguments, binary content (sent when the API and
//! the model take it, replaced by a note otherwise), JSON schemas.

use std::borrow::Cow;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use deepagents_core::ContentBlock;
use deepagents_core::message::{ToolCall, Usage};
use deepagents_core::model::InputModalities;
use serde_json::{Map, Value, json};

/// Tool-call arguments from the JSON text a model produced. Empty text is `{}`; text that is
/// not JSON is kept verbatim as a string so the agent loop can tell the model.
pub fn parse_arguments(text: &str) -> Value {
    if text.trim().is_empty() {
        return Value::Object(Map::new());
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// Tool-call arguments as the JSON text providers expect back.
pub fn arguments_text(call: &ToolCall) -> String {
    match &call.arguments {
        Value::String(raw) => raw.clone(),
        other => other.to_string(),
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

/// The keys of Gemini's `Schema` object (an OpenAPI 3.0 subset) that we send; everything else
/// is reduced to these or dropped, since Gemini refuses the whole request over one unknown key.
/// `title` and `default` are accepted too but only document, so they are left out.
const GEMINI_SCHEMA_KEYS: &[&str] = &[
    "type",
    "format",
    "description",
    "nullable",
    "enum",
    "maxItems",
    "minItems",
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "example",
    "anyOf",
    "propertyOrdering",
    "items",
    "minimum",
    "maximum",
];

/// Which keys of a schema apply to one type, for splitting a multi-type schema into branches.
fn keys_for_type(name: &str) -> &'static [&'static str] {
    match name {
        "string" => &["format", "enum", "minLength", "maxLength", "pattern"],
        "integer" | "number" => &["format", "minimum", "maximum"],
        "array" => &["items", "minItems", "maxItems"],
        "object" => &[
            "properties",
            "required",
            "minProperties",
            "maxProperties",
            "propertyOrdering",
        ],
        _ => &[],
    }
}

/// The `format` values Gemini accepts for a type; others are refused with a 400.
fn format_fits(format: &str, type_name: Option<&str>) -> bool {
    match type_name {
        Some("string") => matches!(format, "enum" | "date-time"),
        Some("integer") => matches!(format, "int32" | "int64"),
        Some("number") => matches!(format, "float" | "double"),
        _ => false,
    }
}

/// Merges an `allOf` part into a schema: properties and `required` are united, other keys
/// the schema already has win (the intersection cannot be expressed, the union is close).
fn merge_into(target: &mut Map<String, Value>, part: &Value) {
    let Value::Object(part) = part else {
        return;
    };
    for (key, value) in part {
        match key.as_str() {
            "allOf" => {
                for inner in value.as_array().into_iter().flatten() {
                    merge_into(target, inner);
                }
            }
            "properties" => {
                let Value::Object(props) = value else {
                    continue;
                };
                let entry = target
                    .entry("properties")
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(existing) = entry {
                    for (name, schema) in props {
                        match existing.get_mut(name) {
                            Some(Value::Object(have)) => merge_into(have, schema),
                            Some(_) => {}
                            None => {
                                existing.insert(name.clone(), schema.clone());
                            }
                        }
                    }
                }
            }
            "required" => {
                let entry = target
                    .entry("required")
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Value::Array(existing) = entry {
                    for name in value.as_array().into_iter().flatten() {
                        if !existing.contains(name) {
                            existing.push(name.clone());
                        }
                    }
                }
            }
            _ => {
                if !target.contains_key(key) {
                    target.insert(key.clone(), value.clone());
                }
            }
        }
    }
}

/// Appends a sentence to a schema's description.
fn add_note(out: &mut Map<String, Value>, note: &str) {
    let text = match out.get("description").and_then(Value::as_str) {
        Some(existing) if !existing.is_empty() => format!("{existing} {note}"),
        _ => note.to_owned(),
    };
    out.insert("description".to_owned(), Value::String(text));
}

/// A tighter lower or upper bound for `key`.
fn bound(out: &mut Map<String, Value>, key: &str, value: f64) {
    let tighter = match out.get(key).and_then(Value::as_f64) {
        Some(have) if key == "minimum" => value > have,
        Some(have) => value < have,
        None => true,
    };
    if tighter && let Some(number) = json_number(value) {
        out.insert(key.to_owned(), number);
    }
}

/// A JSON number, integral when the value is.
fn json_number(value: f64) -> Option<Value> {
    if value.fract() == 0.0 && value.abs() < 9.0e15 {
        Some(Value::from(value as i64))
    } else {
        serde_json::Number::from_f64(value).map(Value::Number)
    }
}

/// The OpenAPI 3.0 subset Gemini's `parameters` accepts ([`GEMINI_SCHEMA_KEYS`]):
///
/// - `$ref`s are inlined and `allOf` parts merged; `oneOf` becomes `anyOf`;
/// - `{"type": "null"}` branches and `null` in a `type` list become `nullable`; a `type` list
///   of several other types becomes an `anyOf` of one branch per type;
/// - `const` becomes a one-value `enum`; `enum` takes strings only, so other values are
///   described in the text (and bound numbers with `minimum`/`maximum`);
/// - `exclusiveMinimum`/`exclusiveMaximum` become `minimum`/`maximum` (one step inside for
///   integers); `format`s Gemini refuses are dropped, as are `not`, `multipleOf`,
///   `uniqueItems`, `additionalProperties` and every other key it does not know.
pub fn gemini_schema(schema: &Value) -> Value {
    clean_gemini(&inline_schema(schema))
}

fn clean_gemini(value: &Value) -> Value {
    let Value::Object(source) = value else {
        // `true` (anything) has no Gemini spelling but an empty schema; `false` cannot occur
        // in a tool's arguments.
        return Value::Object(Map::new());
    };
    let mut map = source.clone();
    if let Some(Value::Array(parts)) = map.remove("allOf") {
        for part in &parts {
            merge_into(&mut map, part);
        }
    }

    let mut out = Map::new();
    let mut nullable = map.get("nullable").and_then(Value::as_bool) == Some(true);

    // The type, or the types of a multi-type schema.
    let mut types: Vec<String> = Vec::new();
    match map.get("type") {
        Some(Value::String(name)) if name == "null" => nullable = true,
        Some(Value::String(name)) => types.push(name.clone()),
        Some(Value::Array(names)) => {
            for name in names.iter().filter_map(Value::as_str) {
                if name == "null" {
                    nullable = true;
                } else if !types.iter().any(|t| t == name) {
                    types.push(name.to_owned());
                }
            }
        }
        _ => {}
    }
    if let [single] = types.as_slice() {
        out.insert("type".to_owned(), Value::String(single.clone()));
    }

    if let Some(Value::String(text)) = map.get("description") {
        out.insert("description".to_owned(), Value::String(text.clone()));
    }

    if let Some(Value::Object(props)) = map.get("properties") {
        let props: Map<String, Value> = props
            .iter()
            .map(|(name, s)| (name.clone(), clean_gemini(s)))
            .collect();
        if let Some(Value::Array(required)) = map.get("required") {
            let required: Vec<Value> = required
                .iter()
                .filter(|name| name.as_str().is_some_and(|n| props.contains_key(n)))
                .cloned()
                .collect();
            if !required.is_empty() {
                out.insert("required".to_owned(), Value::Array(required));
            }
        }
        out.insert("properties".to_owned(), Value::Object(props));
    }

    match map.get("items") {
        Some(Value::Array(items)) => match items.as_slice() {
            [] => {}
            [one] => {
                out.insert("items".to_owned(), clean_gemini(one));
            }
            many => {
                out.insert(
                    "items".to_owned(),
                    json!({"anyOf": many.iter().map(clean_gemini).collect::<Vec<_>>()}),
                );
            }
        },
        Some(items) => {
            out.insert("items".to_owned(), clean_gemini(items));
        }
        None => {
            if let Some(Value::Array(prefix)) = map.get("prefixItems")
                && let Some(first) = prefix.first()
            {
                out.insert("items".to_owned(), clean_gemini(first));
            }
        }
    }

    // anyOf (and oneOf, which Gemini lacks): null branches become `nullable`, and a single
    // remaining branch is the schema itself.
    let branches: Vec<&Value> = ["anyOf", "oneOf"]
        .iter()
        .filter_map(|key| map.get(*key).and_then(Value::as_array))
        .flatten()
        .collect();
    let mut kept = Vec::new();
    for branch in branches {
        let cleaned = clean_gemini(branch);
        let is_null = branch.get("type").and_then(Value::as_str) == Some("null");
        if is_null {
            nullable = true;
        } else if !kept.contains(&cleaned) {
            kept.push(cleaned);
        }
    }
    match kept.len() {
        0 => {}
        1 => {
            if let Some(Value::Object(only)) = kept.pop() {
                if only.get("nullable") == Some(&Value::Bool(true)) {
                    nullable = true;
                }
                for (key, v) in only {
                    if key != "nullable" && !out.contains_key(&key) {
                        out.insert(key, v);
                    }
                }
            }
        }
        _ => {
            out.insert("anyOf".to_owned(), Value::Array(kept));
        }
    }

    // const and enum: Gemini's enum holds strings.
    let mut values: Vec<Value> = Vec::new();
    if let Some(constant) = map.get("const") {
        values.push(constant.clone());
    } else if let Some(Value::Array(listed)) = map.get("enum") {
        values.clone_from(listed);
    }
    if values.iter().any(Value::is_null) {
        nullable = true;
        values.retain(|v| !v.is_null());
    }
    if !values.is_empty() {
        if values.iter().all(Value::is_string) {
            out.insert("enum".to_owned(), Value::Array(values));
            if types.is_empty() && !out.contains_key("type") && !out.contains_key("anyOf") {
                out.insert("type".to_owned(), json!("string"));
            }
        } else {
            let shown: Vec<String> = values.iter().map(Value::to_string).collect();
            add_note(&mut out, &format!("Allowed values: {}.", shown.join(", ")));
            let numbers: Vec<f64> = values.iter().filter_map(Value::as_f64).collect();
            if numbers.len() == values.len() {
                let low = numbers.iter().copied().fold(f64::INFINITY, f64::min);
                let high = numbers.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                bound(&mut out, "minimum", low);
                bound(&mut out, "maximum", high);
            }
        }
    }

    // Exclusive bounds become inclusive ones, one step inside for integers.
    let integer = types == ["integer"];
    for (key, exclusive, step) in [
        ("minimum", "exclusiveMinimum", 1.0),
        ("maximum", "exclusiveMaximum", -1.0),
    ] {
        let inclusive = map.get(key).and_then(Value::as_f64);
        if let Some(value) = inclusive {
            bound(&mut out, key, value);
        }
        let limit = match map.get(exclusive) {
            // JSON Schema 2019 and later: the bound itself.
            Some(Value::Number(n)) => n.as_f64(),
            // Draft 4: a flag on `minimum`/`maximum`.
            Some(Value::Bool(true)) => inclusive,
            _ => None,
        };
        if let Some(limit) = limit {
            let inside = match (integer, step > 0.0) {
                (true, true) => limit.floor() + 1.0,
                (true, false) => limit.ceil() - 1.0,
                (false, _) => limit,
            };
            bound(&mut out, key, inside);
        }
    }

    for key in [
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "minLength",
        "maxLength",
        "pattern",
        "propertyOrdering",
    ] {
        if let Some(v) = map.get(key) {
            out.insert(key.to_owned(), v.clone());
        }
    }
    if let Some(example) = map
        .get("example")
        .or_else(|| map.get("examples").and_then(|e| e.as_array()?.first()))
    {
        out.insert("example".to_owned(), example.clone());
    }
    if let Some(Value::String(format)) = map.get("format") {
        let fits = match types.as_slice() {
            [single] => format_fits(format, Some(single)),
            _ => types.iter().any(|t| format_fits(format, Some(t))),
        };
        if fits {
            out.insert("format".to_owned(), Value::String(format.clone()));
        }
    }

    // Several types: one branch per type, each with the keys that apply to it.
    if types.len() > 1 && !out.contains_key("anyOf") {
        let branches: Vec<Value> = types
            .iter()
            .map(|name| {
                let mut branch = Map::new();
                branch.insert("type".to_owned(), Value::String(name.clone()));
                for key in keys_for_type(name) {
                    if let Some(v) = out.get(*key) {
                        if *key == "format"
                            && !format_fits(v.as_str().unwrap_or_default(), Some(name))
                        {
                            continue;
                        }
                        branch.insert((*key).to_owned(), v.clone());
                    }
                }
                Value::Object(branch)
            })
            .collect();
        for name in &types {
            for key in keys_for_type(name) {
                out.remove(*key);
            }
        }
        out.insert("anyOf".to_owned(), Value::Array(branches));
    }

    if nullable {
        out.insert("nullable".to_owned(), Value::Bool(true));
    }
    out.retain(|key, _| GEMINI_SCHEMA_KEYS.contains(&key.as_str()));
    Value::Object(out)
}

/// A tool's `parameters` for Gemini, or `None` for a tool without arguments: Gemini refuses an
/// object schema with no properties ("should be non-empty for OBJECT type").
pub fn gemini_parameters(schema: &Value) -> Option<Value> {
    let cleaned = gemini_schema(schema);
    let empty_object = cleaned.get("type").and_then(Value::as_str) == Some("object")
        && cleaned
            .get("properties")
            .and_then(Value::as_object)
            .is_none_or(Map::is_empty)
        && cleaned.get("anyOf").is_none();
    (!empty_object).then_some(cleaned)
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
    use serde_json::{Value, json};

    use super::{gemini_parameters, gemini_schema, size, text_with_notes};

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

    /// Every key anywhere in a schema, to check nothing Gemini refuses is left.
    fn keys(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, v) in map {
                    out.push(key.clone());
                    if key == "properties" {
                        for schema in v.as_object().into_iter().flat_map(|m| m.values()) {
                            keys(schema, out);
                        }
                    } else {
                        keys(v, out);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| keys(v, out)),
            _ => {}
        }
    }

    fn only_gemini_keys(schema: &Value) {
        let mut found = Vec::new();
        keys(schema, &mut found);
        for key in found {
            assert!(
                super::GEMINI_SCHEMA_KEYS.contains(&key.as_str()),
                "`{key}` is not a Gemini Schema key: {schema}"
            );
        }
    }

    fn property(schema: Value) -> Value {
        let cleaned = gemini_schema(&json!({
            "type": "object",
            "properties": {"x": schema},
        }));
        only_gemini_keys(&cleaned);
        cleaned["properties"]["x"].clone()
    }

    #[test]
    fn one_of_becomes_any_of_and_null_branches_become_nullable() {
        assert_eq!(
            property(json!({"oneOf": [{"type": "string"}, {"type": "integer"}]})),
            json!({"anyOf": [{"type": "string"}, {"type": "integer"}]})
        );
        // What Pydantic writes for `Optional[str]`.
        assert_eq!(
            property(
                json!({"anyOf": [{"type": "string"}, {"type": "null"}], "description": "A note."})
            ),
            json!({"type": "string", "nullable": true, "description": "A note."})
        );
        assert_eq!(
            property(
                json!({"anyOf": [{"type": "string", "format": "uri"}, {"type": "array", "items": {"type": "string"}}, {"type": "null"}]})
            ),
            json!({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}], "nullable": true})
        );
    }

    #[test]
    fn all_of_parts_merge_into_one_schema() {
        let cleaned = property(json!({
            "description": "Outer wins.",
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "description": "Inner."},
                {"properties": {"b": {"type": "integer", "multipleOf": 2}}, "required": ["b"]},
            ],
        }));
        assert_eq!(
            cleaned,
            json!({
                "type": "object",
                "description": "Outer wins.",
                "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            })
        );
    }

    #[test]
    fn keys_gemini_lacks_are_dropped_or_reduced() {
        assert_eq!(
            property(
                json!({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10, "multipleOf": 5})
            ),
            json!({"type": "integer", "minimum": 1, "maximum": 9})
        );
        assert_eq!(
            property(json!({"type": "number", "exclusiveMinimum": 0.5, "maximum": 2})),
            json!({"type": "number", "minimum": 0.5, "maximum": 2})
        );
        // Draft 4 spells exclusivity as a flag on the bound.
        assert_eq!(
            property(json!({"type": "integer", "minimum": 0, "exclusiveMinimum": true})),
            json!({"type": "integer", "minimum": 1})
        );
        assert_eq!(
            property(
                json!({"type": "array", "items": {"type": "string", "format": "email"}, "uniqueItems": true, "minItems": 1})
            ),
            json!({"type": "array", "items": {"type": "string"}, "minItems": 1})
        );
        assert_eq!(
            property(
                json!({"type": "string", "not": {"enum": ["x"]}, "format": "date-time", "examples": ["2025-01-01T00:00:00Z"]})
            ),
            json!({"type": "string", "format": "date-time", "example": "2025-01-01T00:00:00Z"})
        );
        assert_eq!(
            property(
                json!({"type": "object", "additionalProperties": {"type": "string"}, "patternProperties": {}, "properties": {"k": {"type": "string", "title": "K", "default": "v"}}})
            ),
            json!({"type": "object", "properties": {"k": {"type": "string"}}})
        );
    }

    #[test]
    fn const_and_enum_values_become_strings_or_descriptions() {
        assert_eq!(
            property(json!({"const": "fixed"})),
            json!({"type": "string", "enum": ["fixed"]})
        );
        assert_eq!(
            property(json!({"type": "integer", "const": 3})),
            json!({"type": "integer", "minimum": 3, "maximum": 3, "description": "Allowed values: 3."})
        );
        assert_eq!(
            property(json!({"type": "boolean", "const": true, "description": "Must be set."})),
            json!({"type": "boolean", "description": "Must be set. Allowed values: true."})
        );
        assert_eq!(
            property(json!({"type": "integer", "enum": [1, 2, 4]})),
            json!({"type": "integer", "minimum": 1, "maximum": 4, "description": "Allowed values: 1, 2, 4."})
        );
        assert_eq!(
            property(json!({"type": ["string", "null"], "enum": ["a", "b", null]})),
            json!({"type": "string", "enum": ["a", "b"], "nullable": true})
        );
    }

    #[test]
    fn a_type_list_becomes_one_branch_per_type() {
        assert_eq!(
            property(
                json!({"type": ["string", "integer", "null"], "description": "Id.", "maxLength": 8, "minimum": 0})
            ),
            json!({
                "description": "Id.",
                "nullable": true,
                "anyOf": [{"type": "string", "maxLength": 8}, {"type": "integer", "minimum": 0}],
            })
        );
        assert_eq!(
            property(json!({"type": ["null", "boolean"]})),
            json!({"type": "boolean", "nullable": true})
        );
    }

    #[test]
    fn required_names_only_declared_properties_and_refs_are_inlined() {
        let cleaned = gemini_schema(&json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"unit": {"$ref": "#/$defs/Unit"}},
            "required": ["unit", "ghost"],
            "$defs": {"Unit": {"type": "string", "enum": ["c", "f"], "title": "Unit"}},
        }));
        only_gemini_keys(&cleaned);
        assert_eq!(
            cleaned,
            json!({
                "type": "object",
                "properties": {"unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["unit"],
            })
        );
    }

    #[test]
    fn a_tool_without_arguments_sends_no_parameters() {
        assert_eq!(gemini_parameters(&json!({})), None);
        assert_eq!(
            gemini_parameters(
                &json!({"type": "object", "properties": {}, "additionalProperties": false})
            ),
            None
        );
        assert!(
            gemini_parameters(&json!({"type": "object", "properties": {"a": {"type": "string"}}}))
                .is_some()
        );
    }
}
