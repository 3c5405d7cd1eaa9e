//! What runs cost and how much they may spend: prices per model, the running total a run and
//! its subagents share, and hard caps checked before each model call.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::message::Usage;

/// A model's prices in US dollars per million tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Prices {
    /// Prompt tokens neither read from nor written to the provider's cache.
    pub input: f64,
    /// Prompt tokens read from the cache.
    #[serde(default)]
    pub cached_input: f64,
    /// Prompt tokens written to the cache (Anthropic charges extra for them).
    #[serde(default)]
    pub cache_write: f64,
    /// Generated tokens (reasoning included).
    pub output: f64,
}

impl Prices {
    /// What `usage` costs at these prices, in dollars.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let cached = usage.cached_input_tokens.min(usage.input_tokens);
        let written = usage
            .cache_write_input_tokens
            .min(usage.input_tokens - cached);
        let plain = usage.input_tokens - cached - written;
        (plain as f64 * self.input
            + cached as f64 * self.cached_input
            + written as f64 * self.cache_write
            + usage.output_tokens as f64 * self.output)
            / 1_000_000.0
    }
}

/// Tokens and dollars spent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Spent {
    /// Tokens of every model call counted.
    #[serde(default)]
    pub usage: Usage,
    /// Their cost in dollars, for the calls whose model has prices.
    #[serde(default)]
    pub cost_usd: f64,
    /// Tokens of calls to models without known prices (counted in `usage`, not in the cost).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unpriced_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Spent {
    /// All tokens, prompt and answer.
    pub fn tokens(&self) -> u64 {
        self.usage.input_tokens + self.usage.output_tokens
    }

    /// Takes away `earlier` (what was spent before), leaving what was spent since.
    pub fn subtract(&mut self, earlier: &Self) {
        self.usage.input_tokens = self
            .usage
            .input_tokens
            .saturating_sub(earlier.usage.input_tokens);
        self.usage.output_tokens = self
            .usage
            .output_tokens
            .saturating_sub(earlier.usage.output_tokens);
        self.usage.cached_input_tokens = self
            .usage
            .cached_input_tokens
            .saturating_sub(earlier.usage.cached_input_tokens);
        self.usage.cache_write_input_tokens = self
            .usage
            .cache_write_input_tokens
            .saturating_sub(earlier.usage.cache_write_input_tokens);
        self.cost_usd = (self.cost_usd - earlier.cost_usd).max(0.0);
        self.unpriced_tokens = self.unpriced_tokens.saturating_sub(earlier.unpriced_tokens);
    }

    /// Adds `other`.
    pub fn add(&mut self, other: &Self) {
        self.usage += other.usage;
        self.cost_usd += other.cost_usd;
        self.unpriced_tokens += other.unpriced_tokens;
    }
}

/// Hard caps on what a run may spend, its subagents included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SpendLimits {
    /// Dollars, at the models' prices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Tokens, prompt and answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
}

impl SpendLimits {
    /// Whether neither cap is set.
    pub fn is_unlimited(&self) -> bool {
        self.max_cost_usd.is_none() && self.max_tokens.is_none()
    }
}

/// The prices of a model, by its id (`provider:model`), or `None` when unknown.
pub type PriceBook = dyn Fn(&str) -> Option<Prices> + Send + Sync;

/// A run would go past its cap with the next model call, so the call was not made.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub struct SpendCapReached {
    /// The caps.
    pub limits: SpendLimits,
    /// What the run (and its subagents) had spent.
    pub spent: Spent,
    /// The estimated prompt of the call not made: tokens, and dollars when priced.
    pub next_tokens: u64,
    /// Its estimated cost.
    pub next_cost_usd: f64,
}

impl fmt::Display for SpendCapReached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.limits.max_cost_usd, self.limits.max_tokens) {
            (Some(cap), _) if self.spent.cost_usd + self.next_cost_usd > cap => write!(
                f,
                "the run reached its spend cap: ${:.4} spent of ${cap:.4}, and the next model call would cost about ${:.4} more; resume it with a higher cost cap (SpendLimits::max_cost_usd) to go on",
                self.spent.cost_usd, self.next_cost_usd
            ),
            (_, Some(cap)) => write!(
                f,
                "the run reached its token cap: {} tokens used of {cap}, and the next model call would send about {} more; resume it with a higher token cap (SpendLimits::max_tokens) to go on",
                self.spent.tokens(),
                self.next_tokens
            ),
            _ => write!(f, "the run reached its spend cap"),
        }
    }
}

/// What a run tree may spend and has spent, shared by the run and every subagent run it
/// starts; cheap to clone. Every model call is checked against it before it is made and
/// charged to it after.
#[derive(Clone, Default)]
pub struct Budget(Arc<BudgetInner>);

#[derive(Default)]
struct BudgetInner {
    limits: SpendLimits,
    prices: Option<Arc<PriceBook>>,
    spent: Mutex<Spent>,
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Budget")
            .field("limits", &self.0.limits)
            .field("spent", &self.spent())
            .finish_non_exhaustive()
    }
}

impl Budget {
    /// A budget with `limits`, pricing calls with `prices`, starting from `spent` (what the
    /// run spent before a pause or a crash, so a resumed run keeps counting).
    pub fn new(limits: SpendLimits, prices: Option<Arc<PriceBook>>, spent: Spent) -> Self {
        Self(Arc::new(BudgetInner {
            limits,
            prices,
            spent: Mutex::new(spent),
        }))
    }

    /// The caps.
    pub fn limits(&self) -> SpendLimits {
        self.0.limits
    }

    /// What was spent so far.
    pub fn spent(&self) -> Spent {
        *self.0.spent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The prices of `model`, when known.
    pub fn prices_of(&self, model: &str) -> Option<Prices> {
        self.0.prices.as_ref().and_then(|book| book(model))
    }

    /// Whether a call to `model` with a prompt of about `prompt_tokens` stays within the caps.
    pub fn check(&self, model: &str, prompt_tokens: u64) -> Result<(), SpendCapReached> {
        let limits = self.0.limits;
        if limits.is_unlimited() {
            return Ok(());
        }
        let spent = self.spent();
        let next_cost_usd = self.prices_of(model).map_or(0.0, |prices| {
            prices.cost(&Usage {
                input_tokens: prompt_tokens,
                ..Usage::default()
            })
        });
        let over_cost = limits
            .max_cost_usd
            .is_some_and(|cap| spent.cost_usd + next_cost_usd > cap);
        let over_tokens = limits
            .max_tokens
            .is_some_and(|cap| spent.tokens() + prompt_tokens > cap);
        if over_cost || over_tokens {
            return Err(SpendCapReached {
                limits,
                spent,
                next_tokens: prompt_tokens,
                next_cost_usd,
            });
        }
        Ok(())
    }

    /// Records a call to `model` that used `usage`; returns what it cost.
    pub fn charge(&self, model: &str, usage: Usage) -> Spent {
        let mut call = Spent {
            usage,
            ..Spent::default()
        };
        match self.prices_of(model) {
            Some(prices) => call.cost_usd = prices.cost(&usage),
            None => call.unpriced_tokens = usage.input_tokens + usage.output_tokens,
        }
        self.0
            .spent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(&call);
        call
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_count_cached_and_written_tokens_at_their_prices() {
        let prices = Prices {
            input: 3.0,
            cached_input: 0.3,
            cache_write: 3.75,
            output: 15.0,
        };
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 100_000,
            cached_input_tokens: 500_000,
            cache_write_input_tokens: 100_000,
        };
        // 400k plain × 3 + 500k × 0.3 + 100k × 3.75 + 100k out × 15, per million.
        let cost = prices.cost(&usage);
        assert!((cost - (1.2 + 0.15 + 0.375 + 1.5)).abs() < 1e-9, "{cost}");
    }

    #[test]
    fn caps_stop_the_call_that_would_cross_them() {
        let book: Arc<PriceBook> = Arc::new(|model: &str| {
            (model == "priced").then_some(Prices {
                input: 1.0,
                output: 2.0,
                ..Prices::default()
            })
        });
        let budget = Budget::new(
            SpendLimits {
                max_cost_usd: Some(1.0),
                max_tokens: None,
            },
            Some(book),
            Spent::default(),
        );
        assert!(budget.check("priced", 900_000).is_ok());
        let call = budget.charge(
            "priced",
            Usage {
                input_tokens: 400_000,
                output_tokens: 100_000,
                ..Usage::default()
            },
        );
        assert!((call.cost_usd - 0.6).abs() < 1e-9);
        // $0.6 spent: a 300k-token prompt ($0.3) fits, a 500k one ($0.5) does not.
        assert!(budget.check("priced", 300_000).is_ok());
        let stopped = budget.check("priced", 500_000).err();
        assert!(
            stopped
                .as_ref()
                .is_some_and(|e| e.to_string().contains("higher cost cap")),
            "{stopped:?}"
        );
        // Unpriced models cost nothing but are counted.
        budget.charge(
            "unknown",
            Usage {
                input_tokens: 10,
                output_tokens: 5,
                ..Usage::default()
            },
        );
        assert_eq!(budget.spent().unpriced_tokens, 15);
        let tokens = Budget::new(
            SpendLimits {
                max_cost_usd: None,
                max_tokens: Some(1_000),
            },
            None,
            Spent {
                usage: Usage {
                    input_tokens: 900,
                    ..Usage::default()
                },
                ..Spent::default()
            },
        );
        assert!(tokens.check("x", 100).is_ok());
        assert!(tokens.check("x", 101).is_err());
    }
}
