//! Context window and output limits of current models, so context management can compute its
//! thresholds, and the kinds of content besides text each reads. Figures are the providers'
//! published limits; override them with `ModelOptions::profile` and `ModelOptions::modalities`
//! for models not listed or newer limits.

use deepagents_core::ModelProfile;
use deepagents_core::model::InputModalities;

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

const TEXT: InputModalities = InputModalities::TEXT;
const IMAGES: InputModalities = InputModalities {
    images: true,
    ..InputModalities::TEXT
};
const AUDIO: InputModalities = InputModalities {
    audio: true,
    ..InputModalities::TEXT
};
const IMAGES_AND_PDFS: InputModalities = InputModalities::IMAGES_AND_PDFS;
const IMAGES_AND_AUDIO: InputModalities = InputModalities {
    images: true,
    audio: true,
    ..InputModalities::TEXT
};

/// `(lowercase model name prefix, what it reads besides text)`; the longest matching prefix
/// wins. Families whose members differ list the exceptions as longer prefixes.
const MODALITIES: &[(&str, InputModalities)] = &[
    // OpenAI: vision models read PDFs too (as extracted text and page images).
    ("gpt-5", IMAGES_AND_PDFS),
    ("gpt-4.1", IMAGES_AND_PDFS),
    ("gpt-4o", IMAGES_AND_PDFS),
    ("gpt-4o-audio", AUDIO),
    ("gpt-4o-mini-audio", AUDIO),
    ("gpt-audio", AUDIO),
    ("gpt-4-turbo", IMAGES_AND_PDFS),
    ("gpt-4", TEXT),
    ("gpt-4-vision", IMAGES),
    ("gpt-3.5", TEXT),
    ("o1", IMAGES_AND_PDFS),
    ("o1-mini", TEXT),
    ("o1-preview", TEXT),
    ("o3", IMAGES_AND_PDFS),
    ("o3-mini", TEXT),
    ("o4-mini", IMAGES_AND_PDFS),
    ("gpt-oss", TEXT),
    // Anthropic: every Claude 3 model views images; PDFs arrived with Claude 3.5.
    ("claude", IMAGES_AND_PDFS),
    ("claude-3-opus", IMAGES),
    ("claude-3-sonnet", IMAGES),
    ("claude-3-haiku", IMAGES),
    // Google
    ("gemini", InputModalities::ALL),
    ("gemma-3", IMAGES),
    ("gemma3", IMAGES),
    // Open models, as Ollama, vLLM, OpenRouter and others name them.
    ("deepseek", TEXT),
    ("qwen", TEXT),
    ("qwen-vl", IMAGES),
    ("qwen2.5-vl", IMAGES),
    ("qwen2.5vl", IMAGES),
    ("qwen3-vl", IMAGES),
    ("qwen2.5-omni", IMAGES_AND_AUDIO),
    ("qwen3-omni", IMAGES_AND_AUDIO),
    ("llama", TEXT),
    ("llama3.2-vision", IMAGES),
    ("llama-3.2-11b-vision", IMAGES),
    ("llama-3.2-90b-vision", IMAGES),
    ("llama-4", IMAGES),
    ("llama4", IMAGES),
    ("llava", IMAGES),
    ("bakllava", IMAGES),
    ("minicpm-v", IMAGES),
    ("moondream", IMAGES),
    ("granite3.2-vision", IMAGES),
    ("mistral", TEXT),
    ("mistral-medium-3", IMAGES),
    ("mistral-small3.1", IMAGES),
    ("mistral-small-3.1", IMAGES),
    ("mistral-small3.2", IMAGES),
    ("mistral-small-3.2", IMAGES),
    ("pixtral", IMAGES),
];

/// What `model` reads besides text when served by `provider` (`openai`, `ollama`, …).
///
/// Listed families come from the table above. A model not listed is taken to read what the
/// provider's own current models read (OpenAI and Anthropic: images and PDFs; Gemini:
/// everything), and text only on hosts of open models, where most models are text-only and an
/// image would fail the whole request. OpenRouter turns PDFs into text for models that cannot
/// read them, so there PDFs always go through.
pub fn modalities_for(provider: &str, model: &str) -> InputModalities {
    let name = model
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .to_ascii_lowercase();
    let listed = MODALITIES
        .iter()
        .filter(|(prefix, _)| name.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|&(_, modalities)| modalities);
    let mut modalities = listed.unwrap_or(match provider {
        "openai" | "openai_chat" | "anthropic" => IMAGES_AND_PDFS,
        "google_genai" => InputModalities::ALL,
        _ => TEXT,
    });
    if provider == "openrouter" {
        modalities.pdfs = true;
    }
    modalities
}
