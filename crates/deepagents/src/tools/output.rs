//! Shaping tool output so one result cannot flood the context.

/// Most characters a tool returns as text; longer output is cut with a note saying how to get
/// the rest.
pub(crate) const OUTPUT_CAP: usize = 80_000;

/// Joins `lines` with newlines up to [`OUTPUT_CAP`]. When lines are left out, appends a note
/// built from the number of lines omitted.
pub(crate) fn capped_lines(
    lines: impl IntoIterator<Item = String>,
    omitted_note: impl Fn(usize) -> String,
) -> String {
    let mut out = String::new();
    let mut omitted = 0;
    for line in lines {
        if omitted > 0 || out.len() + line.len() + 1 > OUTPUT_CAP {
            omitted += 1;
            continue;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&line);
    }
    if omitted > 0 {
        out.push_str("\n\n");
        out.push_str(&omitted_note(omitted));
    }
    out
}

/// At most `max` characters of `text` (on a character boundary).
pub(crate) fn truncate_chars(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((cut, _)) => &text[..cut],
        None => text,
    }
}
