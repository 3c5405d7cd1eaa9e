//! Content blocks: the pieces a message is made of.

use serde::{Deserialize, Serialize};

/// One piece of message content.
///
/// Binary data (images, PDFs, audio…) is kept as raw bytes with its MIME type and serialized as
/// base64, so a multimodal file read can reach a model unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ContentBlock {
    /// Plain text.
    Text {
        /// The text itself.
        text: String,
    },
    /// Binary data with its MIME type, e.g. `image/png` or `application/pdf`.
    Data {
        /// IANA media type of `data`.
        mime_type: String,
        /// The raw bytes (base64 in JSON).
        #[serde(with = "base64_bytes")]
        #[schemars(with = "String")]
        data: Vec<u8>,
    },
    /// The model's reasoning ("thinking"), kept so it can be sent back to providers that require
    /// it on the next turn. It is not answer text: [`as_text`](Self::as_text) skips it.
    Reasoning {
        /// The readable reasoning or its summary; may be empty when the provider hides it.
        #[serde(default)]
        text: String,
        /// The provider's signature over the reasoning (Anthropic thinking blocks).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
        /// A provider item to send back verbatim (a Responses API reasoning item, an Anthropic
        /// redacted thinking block); its shape belongs to the provider that produced it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        opaque: Option<serde_json::Value>,
    },
}

impl ContentBlock {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text { text: text.into() }
    }

    /// A binary block.
    pub fn data(mime_type: impl Into<String>, data: impl Into<Vec<u8>>) -> Self {
        Self::Data {
            mime_type: mime_type.into(),
            data: data.into(),
        }
    }

    /// The text of a text block, `None` for binary blocks.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Self::Text { text } => Some(text),
            Self::Data { .. } | Self::Reasoning { .. } => None,
        }
    }

    /// Whether this block is an image a vision model can look at.
    pub fn is_image(&self) -> bool {
        matches!(self, Self::Data { mime_type, .. } if mime_type.starts_with("image/"))
    }
}

/// Concatenates the text blocks of `blocks`, skipping binary and reasoning ones.
pub fn joined_text(blocks: &[ContentBlock]) -> String {
    let mut out = String::new();
    for text in blocks.iter().filter_map(ContentBlock::as_text) {
        out.push_str(text);
    }
    out
}

/// Serde adapter: `Vec<u8>` as a standard base64 string.
pub mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes bytes as base64.
    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(bytes))
    }

    /// Deserializes base64 into bytes, with an error that names the problem.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let encoded = String::deserialize(deserializer)?;
        STANDARD
            .decode(encoded.as_bytes())
            .map_err(|e| serde::de::Error::custom(format!("invalid base64 data: {e}")))
    }
}
