//! Tool parameter schemas reduced to the OpenAPI 3.0 subset Gemini's `parameters` accepts.
//! The other providers take JSON Schema as it is (`$ref`s inlined), so this lives beside Gemini.

use serde_json::{Map, Value, json};

use crate::convert::inline_schema;

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

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{gemini_parameters, gemini_schema};

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
