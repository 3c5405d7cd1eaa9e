//! `provider:model` specs.

use std::sync::Arc;

use deepagents_core::Model;

use crate::scripted::{ScriptError, ScriptedModel};

/// Providers this build can resolve, for error messages.
const KNOWN_PROVIDERS: &[&str] = &["scripted:PATH"];

/// A model spec could not be turned into a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The spec has no `provider:` prefix.
    #[error("model spec `{spec}` has no provider; write it as provider:model, one of: {}", KNOWN_PROVIDERS.join(", "))]
    MissingProvider {
        /// The spec as given.
        spec: String,
    },
    /// The provider is not known to this build.
    #[error("unknown model provider `{provider}` in `{spec}`; this build supports: {}", KNOWN_PROVIDERS.join(", "))]
    UnknownProvider {
        /// The provider part.
        provider: String,
        /// The spec as given.
        spec: String,
    },
    /// The scripted model's file is unusable.
    #[error(transparent)]
    Script(#[from] ScriptError),
}

/// Resolves `provider:model` into a model.
pub fn from_spec(spec: &str) -> Result<Arc<dyn Model>, SpecError> {
    let Some((provider, rest)) = spec.split_once(':') else {
        return Err(SpecError::MissingProvider {
            spec: spec.to_owned(),
        });
    };
    match provider {
        "scripted" => Ok(Arc::new(ScriptedModel::from_file(rest)?)),
        _ => Err(SpecError::UnknownProvider {
            provider: provider.to_owned(),
            spec: spec.to_owned(),
        }),
    }
}
