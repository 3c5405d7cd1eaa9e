//! The exit statuses the front ends report besides success and failure, and how an error is
//! printed.

/// Exit status after Ctrl-C, as shells report a SIGINT death (`main` puts the status of the
/// signal that arrived in its place).
pub const INTERRUPTED: u8 = 130;

/// The exit status of a run stopped by `--timeout` (as `timeout(1)`).
pub const TIMEOUT: u8 = 124;

/// The exit status of a run stopped by its spend cap (`--max-cost`, `--max-tokens`).
pub const SPEND_CAP: u8 = 3;

/// The exit status of a run whose answer was cut at the model's output limit: the answer is
/// printed, but it is not whole.
pub const CUT: u8 = 4;

/// The flag that lets a run stopped by `error` go on, for a front end to add to the message
/// (the library's messages name no flags); empty when there is none.
pub fn flag_hint(error: &deepagents::RunError) -> &'static str {
    match error {
        deepagents::RunError::TurnLimit(_) => " (--max-turns N)",
        deepagents::RunError::SpendCap(cap) => match cap.limits.max_cost_usd {
            Some(max) if cap.spent.cost_usd + cap.next_cost_usd > max => " (--max-cost)",
            _ => " (--max-tokens)",
        },
        _ => "",
    }
}

/// One line, except that a cassette diff keeps its lines so it stays readable.
pub fn error_text(text: &str) -> String {
    match text.split_once(":\n") {
        Some((head, diff)) if text.contains("differs from cassette") => {
            format!("{}:\n{}", one_line(head), diff.trim_end())
        }
        _ => one_line(text),
    }
}

/// The words of `text` on one line, single-spaced.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
