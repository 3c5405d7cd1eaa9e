//! `provider:model` specs.

use std::sync::Arc;

use deepagents_core::Model;

use crate::scripted::{ScriptError, ScriptedModel};

/// Providers this build can resolve, for error messages.
#[cfg(feature = "providers")]
const KNOWN_PROVIDERS: &[&str] = &[
    "openai:MODEL (Responses API)",
    "openai_chat:MODEL (Chat Completions)",
    "anthropic:MODEL",
    "google_genai:MODEL",
    "ollama:MODEL",
    "openrouter:VENDOR/MODEL",
    "openai_compatible:MODEL (needs a base URL)",
    "deepseek:MODEL",
    "groq:MODEL",
    "vllm:MODEL",
    "llamacpp:MODEL",
    "lmstudio:MODEL",
    "replay:PATH",
    "scripted:PATH",
];
#[cfg(not(feature = "providers"))]
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
    /// The provider needs an API key and none was found.
    #[error("no API key for {provider}: set {}", variables.join(" or "))]
    MissingKey {
        /// The provider.
        provider: String,
        /// The environment variables that may hold it.
        variables: Vec<&'static str>,
    },
    /// The provider has no default endpoint and none was given.
    #[error("{provider} needs a base URL: set {variable} or give one in the model options")]
    MissingBaseUrl {
        /// The provider.
        provider: String,
        /// The environment variable that may hold it.
        variable: &'static str,
    },
    /// The spec names no model.
    #[error("model spec `{spec}` names no model; write it as provider:model")]
    MissingModel {
        /// The spec as given.
        spec: String,
    },
    /// A cassette could not be read or created.
    #[cfg(feature = "providers")]
    #[error(transparent)]
    Cassette(#[from] crate::cassette::CassetteError),
    /// The HTTP client could not be built.
    #[error("{message}")]
    Client {
        /// Why.
        message: String,
    },
}

/// Resolves `provider:model` into a model, with keys and base URLs from the environment.
pub fn from_spec(spec: &str) -> Result<Arc<dyn Model>, SpecError> {
    #[cfg(feature = "providers")]
    {
        from_spec_with(spec, &crate::ModelOptions::default())
    }
    #[cfg(not(feature = "providers"))]
    {
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
}

#[cfg(feature = "providers")]
pub use with_providers::*;

#[cfg(feature = "providers")]
mod with_providers {
    use std::path::PathBuf;
    use std::sync::Arc;

    use deepagents_core::model::InputModalities;
    use deepagents_core::{Model, ModelProfile};

    use super::{ScriptedModel, SpecError};
    use crate::anthropic::AnthropicWire;
    use crate::cassette::{Cassette, RecordingTransport, ReplayTransport};
    use crate::discovery::{Discovery, Server};
    use crate::gemini::GeminiWire;
    use crate::http::{HttpConfig, ReqwestTransport, Secret, Transport};
    use crate::openai_chat::ChatWire;
    use crate::openai_responses::ResponsesWire;
    use crate::profiles::{modalities_for, profile_for};
    use crate::provider::{HttpModel, ReasoningEffort, Wire};

    /// How to build a provider model beyond its spec: the "config" layer the CLI and library
    /// users fill in. Unset fields fall back to environment variables, then to defaults.
    #[derive(Clone, Debug, Default)]
    pub struct ModelOptions {
        /// Endpoint override; beats the provider's `*_BASE_URL` variable.
        pub base_url: Option<String>,
        /// API key override; beats the provider's key variable.
        pub api_key: Option<Secret>,
        /// Write every exchange to this cassette file.
        pub record: Option<PathBuf>,
        /// Retries after a failed attempt; beats `http.max_retries`.
        pub max_retries: Option<u32>,
        /// Timeouts and retry policy.
        pub http: Option<HttpConfig>,
        /// Context window and output limits, replacing the built-in table's entry (a scripted
        /// model reports them as its profile).
        pub profile: Option<ModelProfile>,
        /// What the model reads besides text (images, PDFs, audio, video), replacing the
        /// built-in table's entry ([`modalities_for`](crate::modalities_for)); content it
        /// cannot read is sent as a note saying so.
        pub modalities: Option<InputModalities>,
        /// Turn Anthropic prompt caching off (on by default).
        pub disable_prompt_caching: bool,
        /// Ask for reasoning (thinking) at this effort; unset leaves the provider's default.
        pub reasoning: Option<ReasoningEffort>,
        /// Cap on one answer's tokens, sent with every request whose settings name none
        /// (`max_completion_tokens`, `max_tokens`, `max_output_tokens` or `maxOutputTokens`,
        /// as the API calls it). Unset sends none except to Anthropic, which requires one and
        /// gets the profile's. A profile's output limit is not sent by itself: the built-in
        /// figures are ceilings, and vLLM refuses a request whose prompt plus cap exceeds its
        /// window.
        pub max_output_tokens: Option<u32>,
    }

    /// The wire format a provider speaks.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Api {
        Responses,
        Chat,
        Anthropic,
        Gemini,
    }

    /// A provider: its API, endpoint and where its key lives.
    struct Provider {
        name: &'static str,
        api: Api,
        default_base_url: Option<&'static str>,
        base_url_vars: &'static [&'static str],
        key_vars: &'static [&'static str],
        key_required: bool,
    }

    const PROVIDERS: &[Provider] = &[
        Provider {
            name: "openai",
            api: Api::Responses,
            default_base_url: Some("https://api.openai.com/v1"),
            base_url_vars: &["OPENAI_BASE_URL"],
            key_vars: &["OPENAI_API_KEY"],
            key_required: true,
        },
        Provider {
            name: "openai_chat",
            api: Api::Chat,
            default_base_url: Some("https://api.openai.com/v1"),
            base_url_vars: &["OPENAI_BASE_URL"],
            key_vars: &["OPENAI_API_KEY"],
            key_required: true,
        },
        Provider {
            name: "anthropic",
            api: Api::Anthropic,
            default_base_url: Some("https://api.anthropic.com"),
            base_url_vars: &["ANTHROPIC_BASE_URL"],
            key_vars: &["ANTHROPIC_API_KEY"],
            key_required: true,
        },
        Provider {
            name: "google_genai",
            api: Api::Gemini,
            default_base_url: Some("https://generativelanguage.googleapis.com"),
            base_url_vars: &["GOOGLE_GEMINI_BASE_URL", "GEMINI_BASE_URL"],
            key_vars: &["GOOGLE_API_KEY", "GEMINI_API_KEY"],
            key_required: true,
        },
        Provider {
            name: "ollama",
            api: Api::Chat,
            default_base_url: Some("http://localhost:11434/v1"),
            base_url_vars: &["OLLAMA_BASE_URL"],
            key_vars: &["OLLAMA_API_KEY"],
            key_required: false,
        },
        Provider {
            name: "openrouter",
            api: Api::Chat,
            default_base_url: Some("https://openrouter.ai/api/v1"),
            base_url_vars: &["OPENROUTER_BASE_URL"],
            key_vars: &["OPENROUTER_API_KEY"],
            key_required: true,
        },
        Provider {
            name: "openai_compatible",
            api: Api::Chat,
            default_base_url: None,
            base_url_vars: &["OPENAI_COMPATIBLE_BASE_URL"],
            key_vars: &["OPENAI_COMPATIBLE_API_KEY"],
            key_required: false,
        },
        Provider {
            name: "deepseek",
            api: Api::Chat,
            default_base_url: Some("https://api.deepseek.com/v1"),
            base_url_vars: &["DEEPSEEK_BASE_URL"],
            key_vars: &["DEEPSEEK_API_KEY"],
            key_required: true,
        },
        Provider {
            name: "groq",
            api: Api::Chat,
            default_base_url: Some("https://api.groq.com/openai/v1"),
            base_url_vars: &["GROQ_BASE_URL"],
            key_vars: &["GROQ_API_KEY"],
            key_required: true,
        },
        Provider {
            name: "vllm",
            api: Api::Chat,
            default_base_url: Some("http://localhost:8000/v1"),
            base_url_vars: &["VLLM_BASE_URL"],
            key_vars: &["VLLM_API_KEY"],
            key_required: false,
        },
        Provider {
            name: "llamacpp",
            api: Api::Chat,
            default_base_url: Some("http://localhost:8080/v1"),
            base_url_vars: &["LLAMACPP_BASE_URL"],
            key_vars: &["LLAMACPP_API_KEY"],
            key_required: false,
        },
        Provider {
            name: "lmstudio",
            api: Api::Chat,
            default_base_url: Some("http://localhost:1234/v1"),
            base_url_vars: &["LMSTUDIO_BASE_URL"],
            key_vars: &["LMSTUDIO_API_KEY"],
            key_required: false,
        },
    ];

    /// The environment variables a provider reads, for front ends that layer settings of
    /// their own beneath them.
    #[derive(Clone, Copy, Debug)]
    #[non_exhaustive]
    pub struct ProviderVariables {
        /// Variables that may hold the base URL; the first one set wins.
        pub base_url: &'static [&'static str],
        /// Variables that may hold the API key; the first one set wins.
        pub api_key: &'static [&'static str],
    }

    /// The environment variables of an HTTP provider (`openai`, `anthropic`, `vllm`, …), or
    /// `None` when no such provider exists.
    pub fn provider_variables(provider: &str) -> Option<ProviderVariables> {
        PROVIDERS
            .iter()
            .find(|p| p.name == provider)
            .map(|p| ProviderVariables {
                base_url: p.base_url_vars,
                api_key: p.key_vars,
            })
    }

    /// The names of the HTTP providers `from_spec_with` resolves (not `scripted` or `replay`).
    pub fn provider_names() -> impl Iterator<Item = &'static str> {
        PROVIDERS.iter().map(|p| p.name)
    }

    fn env(name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.trim().is_empty())
    }

    /// Resolves `provider:model` with explicit options.
    pub fn from_spec_with(spec: &str, options: &ModelOptions) -> Result<Arc<dyn Model>, SpecError> {
        let Some((name, model)) = spec.split_once(':') else {
            return Err(SpecError::MissingProvider {
                spec: spec.to_owned(),
            });
        };
        match name {
            "scripted" => {
                let mut scripted = ScriptedModel::from_file(model)?;
                if let Some(profile) = options.profile {
                    scripted = scripted.with_profile(profile);
                }
                if let Some(modalities) = options.modalities {
                    scripted = scripted.with_modalities(modalities);
                }
                return Ok(Arc::new(scripted));
            }
            "replay" => return replay(model, options),
            _ => {}
        }
        let Some(provider) = PROVIDERS.iter().find(|p| p.name == name) else {
            return Err(SpecError::UnknownProvider {
                provider: name.to_owned(),
                spec: spec.to_owned(),
            });
        };
        if model.trim().is_empty() {
            return Err(SpecError::MissingModel {
                spec: spec.to_owned(),
            });
        }
        let base_url = options
            .base_url
            .clone()
            .or_else(|| provider.base_url_vars.iter().find_map(|v| env(v)))
            .or_else(|| provider.default_base_url.map(str::to_owned))
            .ok_or(SpecError::MissingBaseUrl {
                provider: provider.name.to_owned(),
                variable: provider
                    .base_url_vars
                    .first()
                    .copied()
                    .unwrap_or("a base URL variable"),
            })?;
        let key = options.api_key.clone().or_else(|| {
            provider
                .key_vars
                .iter()
                .find_map(|v| env(v))
                .map(Secret::new)
        });
        if key.is_none() && provider.key_required {
            return Err(SpecError::MissingKey {
                provider: provider.name.to_owned(),
                variables: provider.key_vars.to_vec(),
            });
        }
        let config = http_config(options);
        let local = ["://127.0.0.1", "://localhost", "://[::1]"]
            .iter()
            .any(|host| base_url.contains(host));
        let client = if local {
            ReqwestTransport::direct(&config)
        } else {
            ReqwestTransport::new(&config)
        };
        let mut transport: Arc<dyn Transport> =
            Arc::new(client.map_err(|e| SpecError::Client {
                message: e.to_string(),
            })?);
        if let Some(path) = &options.record {
            transport = Arc::new(RecordingTransport::new(
                transport,
                path.clone(),
                spec.to_owned(),
                Some(base_url.clone()),
                key.iter().cloned().collect(),
            )?);
        }
        Ok(build(
            provider, spec, model, base_url, key, config, transport, options, true, local,
        ))
    }

    fn http_config(options: &ModelOptions) -> HttpConfig {
        let mut config = options.http.clone().unwrap_or_default();
        if let Some(retries) = options.max_retries {
            config.max_retries = retries;
        }
        config
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        provider: &Provider,
        spec: &str,
        model: &str,
        base_url: String,
        key: Option<Secret>,
        config: HttpConfig,
        transport: Arc<dyn Transport>,
        options: &ModelOptions,
        wait: bool,
        local: bool,
    ) -> Arc<dyn Model> {
        let profile = options.profile.or_else(|| profile_for(model));
        // Local servers say their window; asked only when nothing else does (not in replays).
        let server = match provider.name {
            "ollama" => Some(Server::Ollama),
            "openai_compatible" | "vllm" | "llamacpp" => Some(Server::OpenAiCompatible),
            _ => None,
        };
        let discovery = server
            .filter(|_| profile.is_none() && wait)
            .map(|server| Discovery {
                server,
                base_url: base_url.clone(),
                model: model.to_owned(),
                key: key.clone(),
                local,
                max_output_tokens: options.max_output_tokens,
            });
        let modalities = options
            .modalities
            .unwrap_or_else(|| modalities_for(provider.name, model));
        fn make<W: Wire>(
            spec: &str,
            wire: W,
            key: Option<Secret>,
            config: HttpConfig,
            transport: Arc<dyn Transport>,
            profile: Option<ModelProfile>,
            wait: bool,
            discovery: Option<Discovery>,
        ) -> Arc<dyn Model> {
            Arc::new(
                HttpModel::new(spec.to_owned(), wire, key, config, transport, profile, wait)
                    .with_discovery(discovery),
            )
        }
        let model = model.to_owned();
        match provider.api {
            Api::Responses => make(
                spec,
                ResponsesWire {
                    provider: provider.name.to_owned(),
                    base_url,
                    model,
                    reasoning: options.reasoning,
                    modalities,
                    max_output_tokens: options.max_output_tokens,
                },
                key,
                config,
                transport,
                profile,
                wait,
                discovery,
            ),
            Api::Chat => {
                let extra_headers = if provider.name == "openrouter" {
                    vec![("x-title".to_owned(), "deepagents-rs".to_owned())]
                } else {
                    Vec::new()
                };
                make(
                    spec,
                    ChatWire {
                        provider: provider.name.to_owned(),
                        base_url,
                        model,
                        stream_usage: true,
                        extra_headers,
                        reasoning: options.reasoning,
                        modalities,
                        max_output_tokens: options.max_output_tokens,
                        // Only OpenAI itself takes the newer name.
                        legacy_max_tokens: provider.name != "openai_chat",
                    },
                    key,
                    config,
                    transport,
                    profile,
                    wait,
                    discovery,
                )
            }
            Api::Anthropic => make(
                spec,
                AnthropicWire {
                    // `…/v1` is a common way to write the base; the wire adds it itself.
                    base_url: base_url
                        .trim_end_matches('/')
                        .trim_end_matches("/v1")
                        .to_owned(),
                    model,
                    default_max_tokens: options.max_output_tokens.map_or_else(
                        || profile.map_or(8_192, |p| p.max_output_tokens.min(32_000)),
                        u64::from,
                    ),
                    prompt_caching: !options.disable_prompt_caching,
                    reasoning: options.reasoning,
                    modalities,
                },
                key,
                config,
                transport,
                profile,
                wait,
                discovery,
            ),
            Api::Gemini => make(
                spec,
                GeminiWire {
                    base_url: base_url
                        .trim_end_matches('/')
                        .trim_end_matches("/v1beta")
                        .to_owned(),
                    model,
                    reasoning: options.reasoning,
                    modalities,
                    max_output_tokens: options.max_output_tokens,
                },
                key,
                config,
                transport,
                profile,
                wait,
                discovery,
            ),
        }
    }

    fn replay(path: &str, options: &ModelOptions) -> Result<Arc<dyn Model>, SpecError> {
        let path = PathBuf::from(path);
        let cassette = Cassette::load(&path)?;
        let spec = cassette.model.clone();
        let (name, model) = spec.split_once(':').unwrap_or((spec.as_str(), ""));
        let Some(provider) = PROVIDERS.iter().find(|p| p.name == name) else {
            return Err(SpecError::UnknownProvider {
                provider: name.to_owned(),
                spec: spec.clone(),
            });
        };
        let base_url = cassette
            .base_url
            .clone()
            .or_else(|| provider.default_base_url.map(str::to_owned))
            .unwrap_or_default();
        let config = http_config(options);
        let transport: Arc<dyn Transport> = Arc::new(ReplayTransport::new(path.clone(), cassette));
        let id = format!("replay:{}", path.display());
        let model = build(
            provider, &spec, model, base_url, None, config, transport, options, false, false,
        );
        Ok(Arc::new(Renamed { id, inner: model }))
    }

    /// A replayed model answers to `replay:PATH`.
    struct Renamed {
        id: String,
        inner: Arc<dyn Model>,
    }

    #[async_trait::async_trait]
    impl Model for Renamed {
        fn id(&self) -> &str {
            &self.id
        }
        fn profile(&self) -> Option<ModelProfile> {
            self.inner.profile()
        }
        async fn resolve_profile(&self) -> Option<ModelProfile> {
            self.inner.resolve_profile().await
        }
        fn input_modalities(&self) -> Option<InputModalities> {
            self.inner.input_modalities()
        }
        async fn generate(
            &self,
            request: &deepagents_core::ModelRequest,
        ) -> Result<deepagents_core::ModelResponse, deepagents_core::ModelError> {
            self.inner.generate(request).await
        }
        async fn stream(
            &self,
            request: &deepagents_core::ModelRequest,
        ) -> Result<deepagents_core::ModelStream, deepagents_core::ModelError> {
            self.inner.stream(request).await
        }
    }
}
