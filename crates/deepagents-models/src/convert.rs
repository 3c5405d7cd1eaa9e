//! Conversions every wire format needs: tool arguments, binary content, JSON schemas.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use deepagents_core::message::{ToolCall, Usage};
use serde_json::{Map, Value};

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

/// The text that stands in for content a provider cannot take.
pub fn unsupported_data(mime_type: &str, len: usize) -> String {
    format!("[{len} bytes of {mime_type} content omitted: this provider does not accept it]")
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

/// The OpenAPI 3.0 subset Gemini's `parameters` accepts: no `additionalProperties`, `$ref`,
/// `const`, `examples` or `default`; `type` a single name with `nullable` for optional ones.
pub fn gemini_schema(schema: &Value) -> Value {
    fn clean(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut out = Map::new();
                for (key, v) in map {
                    match key.as_str() {
                        "additionalProperties"
                        | "$schema"
                        | "$id"
                        | "$ref"
                        | "$defs"
                        | "definitions"
                        | "examples"
                        | "default"
                        | "title"
                        | "$comment"
                        | "unevaluatedProperties"
                        | "patternProperties"
                        | "dependentRequired" => {}
                        "const" => {
                            out.insert("enum".to_owned(), Value::Array(vec![v.clone()]));
                        }
                        "type" => match v {
                            Value::Array(types) => {
                                let names: Vec<&str> =
                                    types.iter().filter_map(Value::as_str).collect();
                                if names.contains(&"null") {
                                    out.insert("nullable".to_owned(), Value::Bool(true));
                                }
                                if let Some(first) = names.iter().find(|t| **t != "null") {
                                    out.insert(
                                        "type".to_owned(),
                                        Value::String((*first).to_owned()),
                                    );
                                }
                            }
                            other => {
                                out.insert("type".to_owned(), other.clone());
                            }
                        },
                        "properties" => {
                            let props = v
                                .as_object()
                                .map(|p| {
                                    p.iter()
                                        .map(|(name, s)| (name.clone(), clean(s)))
                                        .collect::<Map<_, _>>()
                                })
                                .unwrap_or_default();
                            out.insert(key.clone(), Value::Object(props));
                        }
                        _ => {
                            out.insert(key.clone(), clean(v));
                        }
                    }
                }
                Value::Object(out)
            }
            Value::Array(items) => Value::Array(items.iter().map(clean).collect()),
            other => other.clone(),
        }
    }
    clean(&inline_schema(schema))
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
