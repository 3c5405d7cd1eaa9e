//! Models for deepagents, and the resolver that turns a spec string such as
//! `scripted:demo.json` into a model.
//!
//! Provider clients (OpenAI, Anthropic, Gemini, OpenAI-compatible servers) live here too, each
//! in its own module; [`scripted`] replays a fixed script for tests and offline demos.

pub mod scripted;
mod spec;

pub use scripted::{ScriptError, ScriptedModel};
pub use spec::{SpecError, from_spec};
