//! Questions a server asks the user in the middle of a call (MCP elicitation).
//!
//! With an [`Elicitor`] (a front end with someone to ask live: the TUI, a terminal) the tool
//! call waits while it asks. Without one (a server, a run nobody watches, a library) the
//! question becomes the call's suspension ([`ToolOutput::suspend`]): the call is given up on
//! the server (`notifications/cancelled`, and the question answered `cancel`), the run pauses
//! with [`ElicitationRequest::to_json`] as the pending question, and once answered the SAME
//! call is sent to the server again, whose questions are then answered from the answers so
//! far, in order ([`ElicitationAnswer::from_answer`]), until one is new. So whatever the
//! server's tool did before asking happens again: a tool that changes something before its
//! question repeats that change.
//!
//! [`ToolOutput::suspend`]: deepagents_core::ToolOutput::suspend

use deepagents_core::Answer;
use serde_json::{Value, json};

/// A server's question.
#[derive(Clone, Debug, PartialEq)]
pub struct ElicitationRequest {
    /// The server asking.
    pub server: String,
    /// What it asks, for the user.
    pub message: String,
    /// What kind of answer it wants.
    pub kind: Elicitation,
}

/// The answer a server wants.
#[derive(Clone, Debug, PartialEq)]
pub enum Elicitation {
    /// Values for the fields of `schema`: a JSON Schema object whose properties are strings
    /// (optionally with `enum` or a `format`), numbers, integers or booleans, with `required`.
    Form {
        /// The schema.
        schema: Value,
    },
    /// The user completes something at `url` (a sign-in, a payment) and says when done.
    Url {
        /// The page.
        url: String,
    },
}

/// The user's answer.
#[derive(Clone, Debug, PartialEq)]
pub enum ElicitationAnswer {
    /// Given: the form's values as an object (none for a URL).
    Accept(Option<Value>),
    /// Refused; the call goes on without it.
    Decline,
    /// The whole call is to stop.
    Cancel,
}

impl ElicitationRequest {
    /// The question as a suspended call's request (the interrupt's value a client sees):
    /// `{"kind": "mcp_elicitation", "server", "message", "mode": "form", "requestedSchema"}`,
    /// or `"mode": "url"` with `"url"` — MCP's own field names.
    pub fn to_json(&self) -> Value {
        let mut request = json!({
            "kind": "mcp_elicitation",
            "server": self.server,
            "message": self.message,
        });
        match &self.kind {
            Elicitation::Form { schema } => {
                request["mode"] = json!("form");
                request["requestedSchema"] = schema.clone();
            }
            Elicitation::Url { url } => {
                request["mode"] = json!("url");
                request["url"] = json!(url);
            }
        }
        request
    }
}

impl ElicitationAnswer {
    /// The answer a resumed run gave to [`ElicitationRequest::to_json`]: MCP's own result
    /// (`{"action": "accept", "content": {...}}`, `{"action": "decline"}`, `{"action":
    /// "cancel"}`); the words `"accept"`, `"decline"`, `"cancel"`; `true` (accept, for a URL)
    /// or `false` (decline); or any other object as the accepted form's values. A declined
    /// question (a rejection) declines; anything else declines too, as nothing usable was
    /// given.
    pub fn from_answer(answer: &Answer) -> Self {
        let Answer::Given(value) = answer else {
            return Self::Decline;
        };
        let action = |word: &str, content: Option<&Value>| match word {
            "accept" => Self::Accept(content.filter(|c| c.is_object()).cloned()),
            "cancel" => Self::Cancel,
            _ => Self::Decline,
        };
        match value {
            Value::Object(map) => match map.get("action").and_then(Value::as_str) {
                Some(word) => action(word, map.get("content")),
                None => Self::Accept(Some(value.clone())),
            },
            Value::String(word) => action(word.trim(), None),
            Value::Bool(true) => Self::Accept(None),
            _ => Self::Decline,
        }
    }
}

/// Who answers servers' questions during the call: a terminal prompt, a UI panel, a test
/// script. Without one, questions suspend the call (see the [module](self)).
#[async_trait::async_trait]
pub trait Elicitor: Send + Sync {
    /// Asks the user; the server's call waits for the answer (its call timeout still runs).
    async fn elicit(&self, request: ElicitationRequest) -> ElicitationAnswer;
}

/// The fields of a form schema, in order, as `(name, schema, required)`.
pub fn form_fields(schema: &Value) -> Vec<(String, Value, bool)> {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    schema["properties"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, field)| {
            (
                name.clone(),
                field.clone(),
                required.contains(&name.as_str()),
            )
        })
        .collect()
}

/// `text` as the value of `field` (a form property's schema): a number, an integer, a
/// boolean (`y`/`yes`/`true`, `n`/`no`/`false`), one of its `enum` values, or a string.
/// Says what is wrong otherwise.
pub fn parse_field(field: &Value, text: &str) -> Result<Value, String> {
    let text = text.trim();
    let choices: Vec<&str> = field["enum"]
        .as_array()
        .or_else(|| field["items"]["enum"].as_array())
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    match field["type"].as_str() {
        Some("boolean") => match text.to_ascii_lowercase().as_str() {
            "y" | "yes" | "true" => Ok(Value::Bool(true)),
            "n" | "no" | "false" => Ok(Value::Bool(false)),
            _ => Err("answer yes or no".to_owned()),
        },
        Some("integer") => text
            .parse::<i64>()
            .map(Value::from)
            .map_err(|_| "a whole number, please".to_owned()),
        Some("number") => text
            .parse::<f64>()
            .ok()
            .and_then(|n| serde_json::Number::from_f64(n).map(Value::Number))
            .ok_or_else(|| "a number, please".to_owned()),
        _ if !choices.is_empty() => {
            if choices.contains(&text) {
                Ok(Value::String(text.to_owned()))
            } else {
                Err(format!("one of: {}", choices.join(", ")))
            }
        }
        _ => Ok(Value::String(text.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_of_a_resumed_run_become_mcp_results() {
        let of = |value: Value| ElicitationAnswer::from_answer(&Answer::Given(value));
        assert_eq!(
            of(json!({"name": "Ada"})),
            ElicitationAnswer::Accept(Some(json!({"name": "Ada"})))
        );
        assert_eq!(
            of(json!({"action": "accept", "content": {"a": 1}})),
            ElicitationAnswer::Accept(Some(json!({"a": 1})))
        );
        assert_eq!(of(json!({"action": "cancel"})), ElicitationAnswer::Cancel);
        assert_eq!(of(json!("decline")), ElicitationAnswer::Decline);
        assert_eq!(of(json!(true)), ElicitationAnswer::Accept(None));
        assert_eq!(of(json!(3)), ElicitationAnswer::Decline);
        assert_eq!(
            ElicitationAnswer::from_answer(&Answer::Declined(None)),
            ElicitationAnswer::Decline
        );
        let asked = ElicitationRequest {
            server: "s".into(),
            message: "Who?".into(),
            kind: Elicitation::Url {
                url: "https://x.test".into(),
            },
        };
        assert_eq!(
            asked.to_json(),
            json!({"kind": "mcp_elicitation", "server": "s", "message": "Who?", "mode": "url", "url": "https://x.test"})
        );
    }

    #[test]
    fn fields_parse_by_their_type() {
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string"}, "age": {"type": "integer"}, "ok": {"type": "boolean"},
            "color": {"type": "string", "enum": ["red", "blue"]}}, "required": ["name"]});
        let fields = form_fields(&schema);
        assert_eq!(fields.len(), 4);
        assert!(fields.iter().any(|(n, _, r)| n == "name" && *r));
        assert!(fields.iter().any(|(n, _, r)| n == "age" && !*r));
        let field = |name: &str| schema["properties"][name].clone();
        assert_eq!(parse_field(&field("age"), " 42 "), Ok(json!(42)));
        assert!(parse_field(&field("age"), "old").is_err());
        assert_eq!(parse_field(&field("ok"), "Yes"), Ok(json!(true)));
        assert_eq!(parse_field(&field("color"), "blue"), Ok(json!("blue")));
        assert_eq!(
            parse_field(&field("color"), "green"),
            Err("one of: red, blue".to_owned())
        );
        assert_eq!(parse_field(&field("name"), "Ada"), Ok(json!("Ada")));
    }
}
