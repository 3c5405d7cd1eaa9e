//! Context window and output limits of current models, so context management can compute its
//! thresholds. Figures are the providers' published limits; override them with
//! `ModelOptions::profile` for models not listed or newer limits.

use deepagents_core::ModelProfile;

/// `(model name prefix, max input tokens, max output tokens)`; the longest matching prefix wins.
const PROFILES: &[(&str, u64, u64)] = &[
    // OpenAI
    ("gpt-5", 272_000, 128_000),
    ("gpt-4.1", 1_047_576, 32_768),
    ("gpt-4o", 128_000, 16_384),
    ("gpt-4-turbo", 128_000, 4_096),
    ("o1", 200_000, 100_000),
    ("o3", 200_000, 100_000),
    ("o4-mini", 200_000, 100_000),
    ("gpt-oss", 131_072, 131_072),
    // Anthropic
    ("claude-opus-4-1", 200_000, 32_000),
    ("claude-opus-4-0", 200_000, 32_000),
    ("claude-opus-4-2025", 200_000, 32_000),
    ("claude-opus-4", 200_000, 64_000),
    ("claude-sonnet-4", 200_000, 64_000),
    ("claude-haiku-4", 200_000, 64_000),
    ("claude-3-7-sonnet", 200_000, 64_000),
    ("claude-3-5-haiku", 200_000, 8_192),
    ("claude-3-5-sonnet", 200_000, 8_192),
    // Google
    ("gemini-3", 1_048_576, 65_536),
    ("gemini-2.5", 1_048_576, 65_536),
    ("gemini-2.0", 1_048_576, 8_192),
    ("gemini-1.5-pro", 2_097_152, 8_192),
    ("gemini-1.5", 1_048_576, 8_192),
    // Models commonly served by OpenAI-compatible hosts
    ("deepseek-chat", 128_000, 8_192),
    ("deepseek-reasoner", 128_000, 64_000),
    ("qwen3", 131_072, 32_768),
    ("llama-3.3", 131_072, 32_768),
    ("llama3.3", 131_072, 32_768),
];

/// The published limits of `model` (a model name without provider, e.g. `gpt-4o-mini`). Hosts
/// such as OpenRouter prefix names with the vendor (`anthropic/claude-sonnet-4`); that prefix
/// is ignored.
pub fn profile_for(model: &str) -> Option<ModelProfile> {
    let name = model.rsplit('/').next().unwrap_or(model);
    PROFILES
        .iter()
        .filter(|(prefix, _, _)| name.starts_with(prefix))
        .max_by_key(|(prefix, _, _)| prefix.len())
        .map(|&(_, max_input_tokens, max_output_tokens)| ModelProfile {
            max_input_tokens,
            max_output_tokens,
        })
}
