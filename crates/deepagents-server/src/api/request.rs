//! Typed request payloads: how a JSON body (or a query string) becomes a struct, and the
//! field shapes several routes share. A payload's unknown fields are accepted (clients send
//! more than this server reads); a field of the wrong shape is a 422 whose `detail` names it
//! and says what it should be. A field sent as `null` is taken as absent.

use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use serde::de::{self, DeserializeOwned, Deserializer, IntoDeserializer, Visitor};
use serde::{Deserialize, forward_to_deserialize_any};
use serde_json::{Map, Value};

use super::Body0;
use crate::error::{ApiError, ApiResult};

/// `body` (a JSON object) as a `T`, or a 422 naming the field that does not fit.
pub(super) fn parse<T: DeserializeOwned>(body: &Value) -> ApiResult<T> {
    let map = match body {
        Value::Object(map) => map.clone(),
        Value::Null => Map::new(),
        _ => return Err(ApiError::invalid("the body must be a JSON object")),
    };
    // A null field is an absent one (SDKs send `null` for what they leave out).
    let fields = map
        .into_iter()
        .filter(|(_, value)| !value.is_null())
        .map(|(key, value)| (key.clone(), Named { key, value }));
    let deserializer = de::value::MapDeserializer::<_, serde_json::Error>::new(fields);
    T::deserialize(deserializer).map_err(|error| {
        let message = error.to_string();
        // The struct's own complaint: a required field that is not there.
        match message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.strip_suffix('`'))
        {
            Some(name) => ApiError::invalid(format!("`{name}` is missing")),
            None => ApiError::invalid(message),
        }
    })
}

/// A JSON body (absent or empty: `{}`) as a `T`; see [`parse`].
pub(super) struct Typed<T>(pub(super) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Typed<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let Body0(body) = Body0::from_request(request, state).await?;
        parse(&body).map(Self)
    }
}

/// A query string as a `T` (every value a string); a field that does not fit is a 422
/// naming it, as for bodies.
pub(super) struct TypedQuery<T>(pub(super) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for TypedQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|error| ApiError::invalid(error.body_text()))?;
        let map: Map<String, Value> = pairs
            .into_iter()
            .map(|(key, value)| (key, Value::String(value)))
            .collect();
        parse(&Value::Object(map)).map(Self)
    }
}

/// One field of a payload: its value, deserialized as its own, with errors that name it.
struct Named {
    key: String,
    value: Value,
}

impl Named {
    /// serde's complaint about this field, reworded to name it and what it should be.
    fn error(&self, error: serde_json::Error) -> serde_json::Error {
        let key = &self.key;
        let message = error.to_string();
        let reworded = if let Some(rest) = message
            .strip_prefix("invalid type: ")
            .or_else(|| message.strip_prefix("invalid value: "))
            && let Some((got, expected)) = rest.split_once(", expected ")
        {
            // An enum's value that is not a string: serde says "string or map".
            let expected = if expected == "string or map" {
                "a string"
            } else {
                expected
            };
            format!("`{key}` must be {expected}, not {got}")
        } else if let Some(rest) = message.strip_prefix("unknown variant ")
            && let Some((got, expected)) = rest.split_once(", expected ")
        {
            format!("`{key}` must be {expected}, not {got}")
        } else if let Some(rest) = message.strip_prefix("must ") {
            format!("`{key}` must {rest}")
        } else {
            // Already a sentence that says what is wrong (nested fields name themselves).
            message
        };
        de::Error::custom(reworded)
    }
}

impl<'de> IntoDeserializer<'de, serde_json::Error> for Named {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

impl<'de> Deserializer<'de> for Named {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let value = self.value.clone();
        value.deserialize_any(visitor).map_err(|e| self.error(e))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        let value = self.value.clone();
        value.deserialize_option(visitor).map_err(|e| self.error(e))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        let value = self.value.clone();
        value
            .deserialize_enum(name, variants, visitor)
            .map_err(|e| self.error(e))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        let value = self.value.clone();
        value
            .deserialize_newtype_struct(name, visitor)
            .map_err(|e| self.error(e))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_unit()
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct identifier
    }
}

/// A field's value as any JSON, made a `T` by `make` or refused with its message ("must
/// be …", which [`parse`] prefixes with the field's name). Asked for as a newtype, so the
/// refusal happens while the field is being read and is named after it.
pub(super) fn checked<'de, D: Deserializer<'de>, T>(
    deserializer: D,
    make: impl FnOnce(Value) -> Result<T, String>,
) -> Result<T, D::Error> {
    struct Checked<F>(F);

    impl<'de, T, F: FnOnce(Value) -> Result<T, String>> Visitor<'de> for Checked<F> {
        type Value = T;

        fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
            formatter.write_str("any JSON value")
        }

        fn visit_newtype_struct<D: Deserializer<'de>>(self, inner: D) -> Result<T, D::Error> {
            (self.0)(Value::deserialize(inner)?).map_err(de::Error::custom)
        }
    }

    deserializer.deserialize_newtype_struct("Checked", Checked(make))
}

/// A value checked against a shape: refused with "must be `what`, not …" when `fits` says
/// no.
fn shaped<'de, D: Deserializer<'de>>(
    deserializer: D,
    what: &str,
    fits: fn(&Value) -> bool,
) -> Result<Value, D::Error> {
    checked(deserializer, |value| {
        if fits(&value) {
            Ok(value)
        } else {
            Err(format!("must be {what}, not {value}"))
        }
    })
}

/// A count (`limit`, `offset`, `max_depth`): a non-negative integer, or its digits (query
/// strings).
#[derive(Clone, Copy)]
pub(super) struct Count(pub(super) usize);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        checked(deserializer, |value| {
            let count = match &value {
                Value::Number(n) => n.as_u64(),
                Value::String(digits) => digits.trim().parse().ok(),
                _ => None,
            };
            count
                .and_then(|n| usize::try_from(n).ok())
                .map(Self)
                .ok_or_else(|| format!("must be a non-negative integer, not {value}"))
        })
    }
}

/// The count of an optional field, `default` without it.
pub(super) fn count_or(count: Option<Count>, default: usize) -> usize {
    count.map_or(default, |count| count.0)
}

/// A JSON object (`metadata`, a filter).
#[derive(Clone, Default)]
pub(super) struct Object(pub(super) Map<String, Value>);

impl<'de> Deserialize<'de> for Object {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match shaped(deserializer, "an object", Value::is_object)? {
            Value::Object(map) => Ok(Self(map)),
            _ => Ok(Self::default()),
        }
    }
}

/// A store namespace: a list of labels.
#[derive(Clone, Default)]
pub(super) struct Namespace(pub(super) Vec<String>);

impl<'de> Deserialize<'de> for Namespace {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = shaped(deserializer, "a list of strings", |value| {
            value
                .as_array()
                .is_some_and(|labels| labels.iter().all(Value::is_string))
        })?;
        let labels = value.as_array().map(Vec::as_slice).unwrap_or_default();
        Ok(Self(
            labels
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
        ))
    }
}

/// A checkpoint a payload names: its id (a string of digits or a number), or an object
/// holding `checkpoint_id` (also under `configurable`). An object without one names none
/// (the SDK sends what it has).
#[derive(Clone, Copy, Default)]
pub(super) struct CheckpointRef(pub(super) Option<u64>);

impl CheckpointRef {
    /// The checkpoint a value names; an error says what it is not.
    pub(super) fn of(value: &Value) -> Result<Self, String> {
        let id = match value {
            Value::Object(map) => match map
                .get("checkpoint_id")
                .or_else(|| value.pointer("/configurable/checkpoint_id"))
            {
                None | Some(Value::Null) => return Ok(Self(None)),
                Some(id) => id,
            },
            id => id,
        };
        match id {
            Value::String(s) => s.parse().ok(),
            Value::Number(n) => n.as_u64(),
            _ => None,
        }
        .map(|id| Self(Some(id)))
        .ok_or_else(|| {
            format!("must be a checkpoint id (or an object holding `checkpoint_id`), not {id}")
        })
    }
}

impl<'de> Deserialize<'de> for CheckpointRef {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        checked(deserializer, |value| Self::of(&value))
    }
}

/// Declares a string enum of the API: its variants as the API spells them, `as_str`, and
/// the first variant as the default.
macro_rules! api_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
        pub(crate) enum $name {
            #[default]
            $($(#[$vmeta])* #[serde(rename = $text)] $variant),+
        }

        impl $name {
            /// As the API spells it.
            #[allow(dead_code)]
            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text),+
                }
            }
        }
    };
}
pub(super) use api_enum;
