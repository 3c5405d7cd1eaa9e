//! The config file, `~/.deepagents/config.toml` (or `--config FILE`, `DEEPAGENTS_CONFIG`): the
//! default model, each provider's endpoint and retries, and each model's limits.
//!
//! ```toml
//! model = "anthropic:claude-sonnet-4-6"
//!
//! [providers.openai]
//! base_url = "http://127.0.0.1:8000/v1"
//! max_retries = 4
//!
//! [models."openai:my-finetune"]
//! context_window = 32000
//! max_output_tokens = 4096
//! # US dollars per million tokens; cached_input and cache_write default to input.
//! prices = { input = 3.0, output = 12.0, cached_input = 0.75 }
//!
//! [limits]
//! max_cost = 5.0        # dollars per run (--max-cost)
//! max_tokens = 2000000  # tokens per run (--max-tokens)
//! ```
//!
//! A flag beats an environment variable, which beats the file, which beats the built-in
//! default. API keys are never read from the file, only from the environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow};
use deepagents::core::ModelProfile;
use deepagents::models::{self, ModelOptions};
use serde::Deserialize;

/// The output limit assumed when the config sets only a model's context window and the
/// built-in table does not know the model.
const FALLBACK_OUTPUT_TOKENS: u64 = 8_192;

/// The config file, as read.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The default model spec; `--model` and `DEEPAGENTS_MODEL` beat it.
    pub model: Option<String>,
    /// Keep the agent from changing memory: `~/.deepagents/agent/AGENTS.md` and the long-term
    /// memory under `/memories/` become read-only (`--read-only-memory` sets it too).
    #[serde(default)]
    pub read_only_memory: bool,
    /// Whether the filesystem and shell backends confine paths to the root (default `true`);
    /// `false` makes `/etc/hosts` the host's `/etc/hosts`. `--virtual-mode` beats it.
    pub virtual_mode: Option<bool>,
    /// The `execute` tool's shell (`--backend shell`).
    #[serde(default)]
    pub shell: ShellConfig,
    /// The repository backend (`--backend repo`).
    #[serde(default)]
    pub repo: RepoConfig,
    /// The `web_fetch` tool (`--web-fetch`).
    #[serde(default)]
    pub web_fetch: WebFetchConfig,
    /// The confinement of `execute` (`--backend shell`).
    #[serde(default)]
    pub sandbox: crate::sandbox::SandboxConfig,
    /// Settings by provider name (`openai`, `anthropic`, `vllm`, …).
    #[serde(default)]
    providers: BTreeMap<String, toml::Spanned<ProviderConfig>>,
    /// Limits by model spec (`openai:my-finetune`).
    #[serde(default)]
    models: BTreeMap<String, toml::Spanned<ModelConfig>>,
    /// Spend caps per run.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// `deepagents serve`: where it listens and who may call it.
    #[serde(default)]
    pub server: ServerConfig,
    /// `deepagents serve`: assistants besides the one the flags describe.
    #[serde(default)]
    pub assistants: Vec<AssistantConfig>,
}

/// `[web_fetch]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebFetchConfig {
    /// Private, loopback or link-local hosts it may reach besides public ones, each `host`,
    /// `host:port`, `ip` or `ip:port`.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
}

/// `[server]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// The address to listen on; `--listen` beats it.
    pub listen: Option<String>,
    /// API keys and the tenant each acts for (`"KEY" = "TENANT"`); with none, no key is
    /// asked for.
    #[serde(default)]
    pub api_keys: BTreeMap<String, String>,
    /// Origins whose web pages may call the server (`["*"]` any, `[]` none); `--cors` beats
    /// it. Unset: any origin on a loopback address without API keys, none otherwise.
    pub cors: Option<Vec<String>>,
    /// Connections served at once (default 768); more wait until one closes.
    pub max_connections: Option<usize>,
    /// Seconds a client may take to send a request's headers before its connection is
    /// closed (default 30).
    pub header_timeout_secs: Option<u64>,
    /// Hosts a run's `webhook` URL may name (`host`, `host:port`, `*` for any public host);
    /// `--webhook-allow` adds to them. Empty: webhooks are refused.
    #[serde(default)]
    pub webhook_allowed_hosts: Vec<String>,
    /// The key webhook deliveries are signed with (`DEEPAGENTS_WEBHOOK_SECRET` beats it).
    pub webhook_secret: Option<String>,
    /// `[server.auth]`: bearer JWTs, each user its own tenant.
    pub auth: Option<AuthConfig>,
}

/// `[server.auth]`: bearer JWTs verified against a JWKS URL and/or static keys; the user id
/// claim becomes the request's tenant.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// The identity provider's JSON Web Key Set (`https://…/.well-known/jwks.json`);
    /// `--jwks-url` beats it.
    pub jwks_url: Option<String>,
    /// The `iss` tokens must carry; `--jwt-issuer` beats it.
    pub issuer: Option<String>,
    /// The audience (one or a list) of which a token's `aud` must name one; `--jwt-audience`
    /// replaces it.
    #[serde(default, deserialize_with = "one_or_many")]
    pub audience: Vec<String>,
    /// PEM public keys (RSA, EC, Ed25519), relative to the config file's directory;
    /// `--jwt-public-key` adds to them.
    #[serde(default)]
    pub public_keys: Vec<PathBuf>,
    /// The environment variable holding an HS256 secret; `--jwt-secret-env` beats it.
    pub hs256_secret_env: Option<String>,
    /// The claim holding the user id (default `sub`).
    pub user_claim: Option<String>,
    /// Clock skew allowed for `exp`, `nbf` and `iat`, in seconds (default 60).
    pub leeway_secs: Option<u64>,
    /// The least seconds between two fetches of the JWKS for a `kid` it lacks (default 30).
    pub jwks_refetch_secs: Option<u64>,
}

/// A string or a list of strings, as a list.
fn one_or_many<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(deserializer)? {
        OneOrMany::One(one) => vec![one],
        OneOrMany::Many(many) => many,
    })
}

/// One `[[assistants]]` entry: an agent built as the flags build one, with these changes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssistantConfig {
    /// Its graph id, what clients name it by.
    pub name: String,
    /// What it is for.
    pub description: Option<String>,
    /// Its model (default: the server's).
    pub model: Option<String>,
    /// Its system prompt, in place of the default.
    pub system_prompt: Option<String>,
    /// Tools whose calls pause for a decision.
    #[serde(default)]
    pub interrupt_on: Vec<String>,
    /// Its permission rules file.
    pub permissions: Option<std::path::PathBuf>,
    /// Extra `.mcp.json` files.
    #[serde(default)]
    pub mcp_config: Vec<std::path::PathBuf>,
    /// Directories of its subagents.
    #[serde(default)]
    pub agents: Vec<std::path::PathBuf>,
    /// Directories of its skills.
    #[serde(default)]
    pub skills: Vec<std::path::PathBuf>,
}

/// `[limits]`: what one run may spend, its subagents included; `--max-cost` and
/// `--max-tokens` beat them.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Dollars at the models' prices.
    pub max_cost: Option<f64>,
    /// Tokens, prompt and answer.
    pub max_tokens: Option<u64>,
}

/// A model's prices in the config, in US dollars per million tokens.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceConfig {
    input: f64,
    output: f64,
    /// Default: `input`.
    cached_input: Option<f64>,
    /// Default: `input`.
    cache_write: Option<f64>,
}

/// `[shell]`: how `execute` runs commands.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShellConfig {
    /// Seconds a command may run unless the call asks for another limit (default 120, at
    /// most 3,600).
    pub timeout: Option<u64>,
    /// Bytes of output a command may return before it is cut (default 100,000).
    pub max_output: Option<usize>,
    /// Variables every command gets.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Whether commands inherit this process's environment (default `false`: an empty one,
    /// plus `env`).
    #[serde(default)]
    pub inherit_env: bool,
    /// Commands that run without approval when the sandbox is off (`--shell-allow`): a
    /// command matches an entry it starts with, word for word (`git status` allows
    /// `git status --short`), and holds no `;`, `&`, `|`, redirection or substitution.
    #[serde(default)]
    pub allow: Vec<String>,
}

/// `[repo]`: how the repository backend finds repositories and commits.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepoConfig {
    /// Where `owner/name` repositories are: a URL prefix or a local directory.
    pub base: Option<String>,
    /// The commits' author name (default `deepagents`).
    pub author_name: Option<String>,
    /// The commits' author email (default `deepagents@localhost`).
    pub author_email: Option<String>,
    /// The commit message, with `{operation}` and `{path}` replaced.
    pub message: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderConfig {
    /// The endpoint; `--base-url` and the provider's `*_BASE_URL` variable beat it.
    base_url: Option<String>,
    /// Retries of a failed request; `--max-retries` beats it.
    max_retries: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelConfig {
    /// The context window in tokens, replacing the profile's; `--max-input-tokens` beats it.
    context_window: Option<u64>,
    /// Most tokens of one answer, replacing the profile's.
    max_output_tokens: Option<u64>,
    /// Its prices, replacing the built-in list prices.
    prices: Option<PriceConfig>,
}

/// The config file's default place: `~/.deepagents/config.toml`.
fn default_path() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
    Some(Path::new(&home).join(".deepagents/config.toml"))
}

/// Reads the config file: `explicit` (from `--config` or `DEEPAGENTS_CONFIG`), which must
/// exist, else the default one, which may be missing.
pub fn load(explicit: Option<&Path>) -> anyhow::Result<Config> {
    let (path, text) = match explicit {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the config file {}", path.display()))?;
            (path.to_owned(), text)
        }
        None => {
            let Some(path) = default_path() else {
                return Ok(Config::default());
            };
            match std::fs::read_to_string(&path) {
                Ok(text) => (path, text),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Ok(Config::default());
                }
                Err(e) => {
                    return Err(anyhow::Error::new(e)
                        .context(format!("cannot read the config file {}", path.display())));
                }
            }
        }
    };
    parse(&text, &path)
}

/// Parses and checks a config file's text; errors name the file, the line and the key.
fn parse(text: &str, path: &Path) -> anyhow::Result<Config> {
    let mut config: Config = toml::from_str(text).map_err(|e| describe(&e, text, path))?;
    if let (Some(auth), Some(dir)) = (&mut config.server.auth, path.parent()) {
        for key in &mut auth.public_keys {
            if key.is_relative() {
                *key = dir.join(&*key);
            }
        }
    }
    let at = |span: std::ops::Range<usize>, message: String| {
        let (line, key) = locate(text, span.start);
        anyhow!("{}", located(path, line, None, key.as_deref(), &message))
    };
    for (name, provider) in &config.providers {
        if models::provider_variables(name).is_none() {
            let known: Vec<&str> = models::provider_names().collect();
            return Err(at(
                provider.span(),
                format!(
                    "unknown provider `{name}`; known providers: {}",
                    known.join(", ")
                ),
            ));
        }
        if provider
            .get_ref()
            .base_url
            .as_deref()
            .is_some_and(|url| url.trim().is_empty())
        {
            return Err(at(provider.span(), "base_url is empty".to_owned()));
        }
    }
    for (spec, limits) in &config.models {
        if !spec.contains(':') {
            return Err(at(
                limits.span(),
                format!("`{spec}` is not a model spec; write it as provider:model"),
            ));
        }
        let limits = limits.get_ref();
        if limits.context_window == Some(0) || limits.max_output_tokens == Some(0) {
            return Err(at(
                config.models[spec].span(),
                "context_window and max_output_tokens must be above 0".to_owned(),
            ));
        }
    }
    let negative = |n: f64| !n.is_finite() || n < 0.0;
    for (spec, model) in &config.models {
        if let Some(prices) = model.get_ref().prices
            && [prices.input, prices.output]
                .into_iter()
                .chain(prices.cached_input)
                .chain(prices.cache_write)
                .any(negative)
        {
            return Err(at(
                model.span(),
                format!("the prices of `{spec}` must be numbers of dollars, 0 or more"),
            ));
        }
    }
    if config
        .limits
        .max_cost
        .is_some_and(|c| negative(c) || c == 0.0)
        || config.limits.max_tokens == Some(0)
    {
        return Err(anyhow!(
            "{}",
            located(
                path,
                locate(text, text.find("[limits]").unwrap_or(0)).0,
                None,
                Some("limits"),
                "max_cost and max_tokens must be above 0",
            )
        ));
    }
    Ok(config)
}

impl Config {
    /// The prices model calls are charged at: the file's `prices` for the spec, else the
    /// providers' list prices.
    pub fn price_book(&self) -> impl Fn(&str) -> Option<deepagents::core::Prices> + use<> {
        let own: BTreeMap<String, deepagents::core::Prices> = self
            .models
            .iter()
            .filter_map(|(spec, model)| {
                let prices = model.get_ref().prices?;
                Some((
                    spec.clone(),
                    deepagents::core::Prices {
                        input: prices.input,
                        output: prices.output,
                        cached_input: prices.cached_input.unwrap_or(prices.input),
                        cache_write: prices.cache_write.unwrap_or(prices.input),
                    },
                ))
            })
            .collect();
        move |model: &str| {
            own.get(model)
                .copied()
                .or_else(|| models::prices::list_prices(model))
        }
    }

    /// Fills in what the flags left unset: the provider's endpoint (unless its `*_BASE_URL`
    /// variable is set, which beats the file), its retries, and the model's limits, merged
    /// into the built-in profile.
    pub fn apply(&self, spec: &str, options: &mut ModelOptions) {
        let (provider, model) = spec.split_once(':').unwrap_or((spec, ""));
        if let Some(settings) = self.providers.get(provider).map(toml::Spanned::get_ref) {
            let env_has_url = models::provider_variables(provider).is_some_and(|vars| {
                vars.base_url
                    .iter()
                    .any(|v| std::env::var(v).is_ok_and(|url| !url.trim().is_empty()))
            });
            if options.base_url.is_none() && !env_has_url {
                options.base_url.clone_from(&settings.base_url);
            }
            if options.max_retries.is_none() {
                options.max_retries = settings.max_retries;
            }
        }
        if let Some(limits) = self.models.get(spec).map(toml::Spanned::get_ref)
            && (limits.context_window.is_some() || limits.max_output_tokens.is_some())
        {
            let built_in = options.profile.or_else(|| models::profile_for(model));
            // An output limit alone makes no window up: a local server may still say it.
            let window_known = limits.context_window.is_some() || built_in.is_some();
            options.profile = window_known.then(|| ModelProfile {
                max_input_tokens: limits
                    .context_window
                    .or(built_in.map(|p| p.max_input_tokens))
                    .unwrap_or(deepagents::context::FALLBACK_CONTEXT_TOKENS),
                max_output_tokens: limits
                    .max_output_tokens
                    .or(built_in.map(|p| p.max_output_tokens))
                    .unwrap_or(FALLBACK_OUTPUT_TOKENS),
            });
            // The profile only informs context management; a limit the file names is also
            // sent with every request (an assumed one is not: vLLM refuses a request whose
            // prompt plus cap exceeds its window).
            if options.max_output_tokens.is_none() {
                options.max_output_tokens = limits
                    .max_output_tokens
                    .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
            }
        }
    }
}

/// A TOML error as one line naming the file, the line and, when it can tell, the key.
fn describe(error: &toml::de::Error, text: &str, path: &Path) -> anyhow::Error {
    let message = error.message().trim();
    let Some(span) = error.span() else {
        return anyhow!("the config file {} is invalid: {message}", path.display());
    };
    let (line, key) = locate(text, span.start);
    let column = text[..span.start]
        .rsplit('\n')
        .next()
        .map_or(1, |before| before.chars().count() + 1);
    if message.starts_with("unknown field `api_key`") {
        let provider = key.as_deref().and_then(provider_of);
        let variables = provider
            .and_then(|p| models::provider_variables(&p))
            .map(|vars| vars.api_key.join(" or "))
            .filter(|vars| !vars.is_empty())
            .unwrap_or_else(|| {
                "the provider's key variable (e.g. OPENAI_API_KEY, ANTHROPIC_API_KEY)".to_owned()
            });
        let message = format!(
            "API keys are never read from the config file; remove it and set {variables} in the environment"
        );
        return anyhow!("{}", located(path, line, None, key.as_deref(), &message));
    }
    anyhow!(
        "{}",
        located(path, line, Some(column), key.as_deref(), message)
    )
}

fn located(
    path: &Path,
    line: usize,
    column: Option<usize>,
    key: Option<&str>,
    message: &str,
) -> String {
    let mut place = format!("the config file {}, line {line}", path.display());
    if let Some(column) = column.filter(|_| key.is_none()) {
        place.push_str(&format!(", column {column}"));
    }
    if let Some(key) = key {
        place.push_str(&format!(", key `{key}`"));
    }
    format!("{place}: {message}")
}

/// The 1-based line of `offset`, and the dotted key written there (with the table header
/// above it), when the line holds one.
fn locate(text: &str, offset: usize) -> (usize, Option<String>) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let mut lines = text
        .lines()
        .take(line)
        .collect::<Vec<_>>()
        .into_iter()
        .rev();
    let current = lines.next().unwrap_or("").trim();
    if let Some(header) = header(current) {
        return (line, Some(header));
    }
    let key = until_unquoted(current, '=')
        .map(str::trim)
        .filter(|k| !k.is_empty());
    let table = lines.find_map(|l| header(l.trim()));
    let key = match (table, key) {
        (Some(table), Some(key)) => Some(format!("{table}.{key}")),
        (None, Some(key)) => Some(key.to_owned()),
        (Some(table), None) => Some(table),
        (None, None) => None,
    };
    (line, key)
}

/// `[a.b]` or `[[a.b]]` → `a.b`.
fn header(line: &str) -> Option<String> {
    let inner = line.strip_prefix('[')?;
    let inner = inner.strip_prefix('[').unwrap_or(inner);
    until_unquoted(inner, ']').map(|h| h.trim().to_owned())
}

/// The text before the first `stop` outside quotes, if there is one.
fn until_unquoted(text: &str, stop: char) -> Option<&str> {
    let mut quote = None;
    for (i, c) in text.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == stop => return Some(&text[..i]),
            None if c == '#' => return None,
            None => {}
        }
    }
    None
}

/// The provider a key path belongs to: `providers.NAME.…` or `models."NAME:model".…`.
fn provider_of(key: &str) -> Option<String> {
    let unquote = |s: &str| s.trim().trim_matches(|c| c == '"' || c == '\'').to_owned();
    if let Some(rest) = key.strip_prefix("providers.") {
        return Some(unquote(until_unquoted(rest, '.').unwrap_or(rest)));
    }
    let rest = key.strip_prefix("models.")?;
    let spec = unquote(until_unquoted(rest, '.').unwrap_or(rest));
    spec.split_once(':')
        .map(|(provider, _)| provider.to_owned())
}
