//! Text operations shared by backends: paging lines, exact-string edits, line search.

use regex::{Regex, RegexBuilder};

use crate::protocol::{BackendError, GrepMatch, GrepQuery, ReadResult};

/// Lines of `text`: `\n` ends a line and a `\r` before it is dropped; a final terminator does
/// not start an extra empty line.
pub fn lines(text: &str) -> impl Iterator<Item = &str> {
    let body = text.strip_suffix('\n').unwrap_or(text);
    let empty = text.is_empty();
    body.split('\n')
        .filter(move |_| !empty)
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
}

/// The page `offset..offset + limit` of `text`.
pub fn page(text: &str, offset: usize, limit: usize) -> ReadResult {
    let mut total_lines = 0;
    let mut selected = Vec::new();
    for (index, line) in lines(text).enumerate() {
        total_lines += 1;
        if index >= offset && selected.len() < limit {
            selected.push(line.to_owned());
        }
    }
    ReadResult::Text {
        lines: selected,
        offset,
        total_lines,
    }
}

/// Replaces `old` by `new` in `text`. `old` must occur exactly once unless `replace_all`.
pub fn replace(
    path: &str,
    text: &str,
    old: &str,
    new: &str,
    replace_all: bool,
) -> Result<(String, usize), BackendError> {
    if old.is_empty() {
        return Err(BackendError::InvalidQuery {
            what: "edit",
            message: "the text to replace is empty; to create or overwrite a file use write_file"
                .to_owned(),
        });
    }
    let count = text.matches(old).count();
    match count {
        0 => Err(BackendError::StringNotFound {
            path: path.to_owned(),
        }),
        1 => Ok((text.replacen(old, new, 1), 1)),
        _ if replace_all => Ok((text.replace(old, new), count)),
        _ => Err(BackendError::NotUnique {
            path: path.to_owned(),
            count,
        }),
    }
}

/// A compiled grep query for in-memory text.
#[derive(Clone, Debug)]
pub struct LineMatcher {
    regex: Regex,
}

impl LineMatcher {
    /// Compiles `query`: literal patterns are escaped, regexes are checked.
    pub fn new(query: &GrepQuery) -> Result<Self, BackendError> {
        let source = if query.regex {
            query.pattern.clone()
        } else {
            regex::escape(&query.pattern)
        };
        let regex = RegexBuilder::new(&source)
            .case_insensitive(query.case_insensitive)
            .build()
            .map_err(|e| BackendError::InvalidQuery {
                what: "regex",
                message: e.to_string(),
            })?;
        Ok(Self { regex })
    }

    /// Appends the matches in `text` (a file at `path`) to `out`, stopping at `max` in all.
    /// Returns whether it stopped early.
    pub fn search(&self, path: &str, text: &str, out: &mut Vec<GrepMatch>, max: usize) -> bool {
        for (index, line) in lines(text).enumerate() {
            if self.regex.is_match(line) {
                if out.len() >= max {
                    return true;
                }
                out.push(GrepMatch {
                    path: path.to_owned(),
                    line_number: index + 1,
                    line: line.to_owned(),
                });
            }
        }
        false
    }
}
