//! Timestamps as the API writes them: RFC 3339 in UTC with milliseconds.

pub use deepagents_langgraph::convert::now_ms;

/// `2026-12-02T16:37:05.123Z` for milliseconds since the Unix epoch.
pub fn rfc3339(ms: u64) -> String {
    deepagents::core::event::rfc3339_ms(ms)
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
    }
}
