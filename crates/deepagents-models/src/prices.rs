//! What current models cost, from the providers' published list prices (standard tier, prompts
//! up to 200k tokens where the price depends on length), in US dollars per million tokens.
//! Prices change: override them (the CLI's `[prices]` in `config.toml`, `AgentBuilder::prices`)
//! for newer ones, negotiated rates, or models not listed.

use deepagents_core::Prices;

/// When the table was last checked against the providers' price pages.
pub const PRICES_CHECKED: &str = "2025-10";

/// `(model name prefix, input, cached input, cache write, output)`; the longest matching prefix
/// wins. Cache writes cost extra only at Anthropic (5-minute cache); elsewhere they cost the
/// input price.
const PRICES: &[(&str, f64, f64, f64, f64)] = &[
    // OpenAI
    ("gpt-5", 1.25, 0.125, 1.25, 10.0),
    ("gpt-5-mini", 0.25, 0.025, 0.25, 2.0),
    ("gpt-5-nano", 0.05, 0.005, 0.05, 0.40),
    ("gpt-4.1", 2.0, 0.50, 2.0, 8.0),
    ("gpt-4.1-mini", 0.40, 0.10, 0.40, 1.60),
    ("gpt-4.1-nano", 0.10, 0.025, 0.10, 0.40),
    ("gpt-4o", 2.50, 1.25, 2.50, 10.0),
    ("gpt-4o-mini", 0.15, 0.075, 0.15, 0.60),
    ("o1", 15.0, 7.50, 15.0, 60.0),
    ("o3", 2.0, 0.50, 2.0, 8.0),
    ("o4-mini", 1.10, 0.275, 1.10, 4.40),
    // Anthropic
    ("claude-opus-4-5", 5.0, 0.50, 6.25, 25.0),
    ("claude-opus-4", 15.0, 1.50, 18.75, 75.0),
    ("claude-sonnet-4", 3.0, 0.30, 3.75, 15.0),
    ("claude-haiku-4", 1.0, 0.10, 1.25, 5.0),
    ("claude-3-7-sonnet", 3.0, 0.30, 3.75, 15.0),
    ("claude-3-5-sonnet", 3.0, 0.30, 3.75, 15.0),
    ("claude-3-5-haiku", 0.80, 0.08, 1.0, 4.0),
    // Google
    ("gemini-2.5-pro", 1.25, 0.31, 1.25, 10.0),
    ("gemini-2.5-flash", 0.30, 0.075, 0.30, 2.50),
    ("gemini-2.5-flash-lite", 0.10, 0.025, 0.10, 0.40),
    ("gemini-2.0-flash", 0.10, 0.025, 0.10, 0.40),
    // DeepSeek
    ("deepseek-chat", 0.28, 0.028, 0.28, 0.42),
    ("deepseek-reasoner", 0.28, 0.028, 0.28, 0.42),
];

/// The list prices of `model`: a spec (`anthropic:claude-sonnet-4-5`) or a bare name; a host's
/// vendor prefix (`anthropic/claude-sonnet-4`) is ignored. `None` for models not listed
/// (local models, unknown hosts): their calls are counted in tokens, not in dollars.
pub fn list_prices(model: &str) -> Option<Prices> {
    let name = model.rsplit([':', '/']).next().unwrap_or(model);
    PRICES
        .iter()
        .filter(|(prefix, ..)| name.starts_with(prefix))
        .max_by_key(|(prefix, ..)| prefix.len())
        .map(|&(_, input, cached_input, cache_write, output)| Prices {
            input,
            cached_input,
            cache_write,
            output,
        })
}

#[cfg(test)]
mod tests {
    use super::list_prices;

    #[test]
    fn the_longest_prefix_prices_a_model() {
        let mini = list_prices("openai:gpt-4o-mini-2024-07-18").map(|p| p.output);
        assert_eq!(mini, Some(0.60));
        assert_eq!(list_prices("gpt-4o").map(|p| p.output), Some(10.0));
        assert_eq!(
            list_prices("openrouter:anthropic/claude-sonnet-4-5").map(|p| p.cache_write),
            Some(3.75)
        );
        assert_eq!(list_prices("ollama:llama3.3"), None);
    }
}
