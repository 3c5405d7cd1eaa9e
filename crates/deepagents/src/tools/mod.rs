//! The built-in tools the model sees. Each tool is a typed [`Tool`](deepagents_core::Tool)
//! whose description states its limits; middleware offers them.

pub(crate) mod ask_user;
pub(crate) mod execute;
pub(crate) mod filesystem;
pub(crate) mod output;
#[cfg(feature = "remote")]
pub(crate) mod web_fetch;
