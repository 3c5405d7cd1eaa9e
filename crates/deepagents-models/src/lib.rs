//! Models for deepagents, and the resolver that turns a spec string such as
//! `anthropic:claude-sonnet-4-5` or `scripted:demo.json` into a model.
//!
//! Provider clients (OpenAI Responses and Chat Completions, Anthropic, Gemini, and
//! OpenAI-compatible servers such as Ollama, OpenRouter, vLLM or llama.cpp) live behind the
//! `providers` feature (on by default), one module per wire format over a shared HTTP layer
//! ([`http`]: timeouts, retries with backoff and jitter, SSE parsing, error classification).
//! [`cassette`] records and replays their exchanges; [`scripted`] replays a fixed script for
//! tests and offline demos.

#[cfg(feature = "providers")]
pub mod anthropic;
#[cfg(feature = "providers")]
pub mod cassette;
#[cfg(feature = "providers")]
mod convert;
#[cfg(feature = "providers")]
mod discovery;
#[cfg(feature = "http-client")]
pub mod egress;
#[cfg(feature = "providers")]
pub mod encoded;
#[cfg(feature = "providers")]
pub mod gemini;
#[cfg(feature = "providers")]
pub mod http;
#[cfg(feature = "providers")]
pub mod openai_chat;
#[cfg(feature = "providers")]
pub mod openai_responses;
pub mod prices;
pub mod profiles;

/// A reqwest client builder whose TLS works: rustls with the `ring` provider, installed as the
/// process default when none is (reqwest is built without a provider of its own, so that no C
/// toolchain is needed; a provider the application installed first is kept). Every HTTP
/// client of deepagents starts here.
#[cfg(feature = "http-client")]
pub fn http_client() -> reqwest::ClientBuilder {
    // `Err` means a provider is already installed, which is all that is needed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}
#[cfg(feature = "providers")]
pub mod provider;
pub mod scripted;
mod spec;

pub use profiles::{modalities_for, profile_for};
#[cfg(feature = "providers")]
pub use provider::ReasoningEffort;
pub use scripted::{ScriptError, ScriptedModel};
#[cfg(feature = "providers")]
pub use spec::{
    ModelOptions, ProviderVariables, from_spec_with, provider_names, provider_variables,
};
pub use spec::{SpecError, from_spec};
