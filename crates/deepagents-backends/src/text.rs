//! Text operations shared by backends: paging lines, exact-string edits, line search.
//!
//! Text need not be UTF-8 (see [`crate::mime`]): the byte-wise variants show invalid bytes as
//! U+FFFD, the way `String::from_utf8_lossy` does, and edits keep every byte they do not replace.

use regex::bytes::{Regex, RegexBuilder};

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

/// Lines of `bytes`, split as [`lines`] splits text. `\n` never occurs inside a UTF-8 sequence,
/// valid or not, so splitting bytes and then decoding each line lossily gives the lines of the
/// lossily decoded whole.
pub fn byte_lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let empty = bytes.is_empty();
    body.split(|&b| b == b'\n')
        .filter(move |_| !empty)
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
}

/// A line as the model sees it: invalid UTF-8 shows as U+FFFD.
pub fn lossy(line: &[u8]) -> String {
    String::from_utf8_lossy(line).into_owned()
}

/// The page `offset..offset + limit` of `text`.
pub fn page(text: &str, offset: usize, limit: usize) -> ReadResult {
    page_bytes(text.as_bytes(), offset, limit)
}

/// The page `offset..offset + limit` of text held as bytes (invalid UTF-8 shows as U+FFFD).
pub fn page_bytes(bytes: &[u8], offset: usize, limit: usize) -> ReadResult {
    let mut pager = Pager::new(offset, limit, usize::MAX);
    pager.feed(bytes);
    pager.finish()
}

/// Pages text fed in chunks of any size, keeping only the selected lines: a file far larger
/// than memory is paged by streaming it through once. The lines are those of [`byte_lines`].
#[derive(Debug)]
pub struct Pager {
    offset: usize,
    limit: usize,
    /// Most bytes of selected lines kept; lines past it are counted but not kept.
    budget: usize,
    /// Lines ended so far (the 0-based index of the current line).
    index: usize,
    /// Whether bytes followed the last `\n` seen (a final line without terminator).
    partial: bool,
    /// The bytes of the current line so far, when it is selected.
    current: Vec<u8>,
    lines: Vec<String>,
    used: usize,
    /// No more lines are kept (the budget ran out).
    full: bool,
    /// The first selected line alone is over the budget.
    over_budget: bool,
}

impl Pager {
    /// A pager keeping lines `offset..offset + limit`, at most `budget` bytes of them.
    pub fn new(offset: usize, limit: usize, budget: usize) -> Self {
        Self {
            offset,
            limit,
            budget,
            index: 0,
            partial: false,
            current: Vec::new(),
            lines: Vec::new(),
            used: 0,
            full: false,
            over_budget: false,
        }
    }

    /// Whether the current line is kept.
    fn selecting(&self) -> bool {
        !self.full && self.index >= self.offset && self.lines.len() < self.limit
    }

    /// Whether no later line can be kept, so the rest only needs counting.
    fn done(&self) -> bool {
        self.full || self.lines.len() >= self.limit
    }

    /// The next chunk of the text.
    pub fn feed(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() {
            if self.done() {
                self.index += chunk.iter().filter(|&&b| b == b'\n').count();
                self.partial = !chunk.ends_with(b"\n");
                return;
            }
            match chunk.iter().position(|&b| b == b'\n') {
                Some(at) => {
                    self.take(&chunk[..at]);
                    self.end_line();
                    chunk = &chunk[at + 1..];
                }
                None => {
                    self.take(chunk);
                    self.partial = true;
                    return;
                }
            }
        }
    }

    fn take(&mut self, bytes: &[u8]) {
        if !self.selecting() {
            return;
        }
        if self.used + self.current.len() + bytes.len() > self.budget {
            self.over_budget = self.lines.is_empty();
            self.full = true;
            self.current = Vec::new();
        } else {
            self.current.extend_from_slice(bytes);
        }
    }

    fn end_line(&mut self) {
        if self.selecting() {
            let line = self.current.strip_suffix(b"\r").unwrap_or(&self.current);
            self.lines.push(lossy(line));
            self.used += self.current.len();
            self.current.clear();
        }
        self.index += 1;
        self.partial = false;
    }

    /// Whether the first selected line alone was over the budget (then nothing was kept).
    pub fn over_budget(&self) -> bool {
        self.over_budget
    }

    /// The page, after the last chunk.
    pub fn finish(mut self) -> ReadResult {
        if self.partial {
            self.end_line();
        }
        ReadResult::Text {
            lines: self.lines,
            offset: self.offset,
            total_lines: self.index,
        }
    }
}

fn check_old(old: &str) -> Result<(), BackendError> {
    if old.is_empty() {
        return Err(BackendError::InvalidQuery {
            what: "edit",
            message:
                "the text to replace is empty; to create a file use write_file (to replace one \
                      whole, delete it first)"
                    .to_owned(),
        });
    }
    Ok(())
}

/// Replaces `old` by `new` in `text`. `old` must occur exactly once unless `replace_all`.
pub fn replace(
    path: &str,
    text: &str,
    old: &str,
    new: &str,
    replace_all: bool,
) -> Result<(String, usize), BackendError> {
    check_old(old)?;
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

/// Replaces `old` by `new` in text held as bytes that need not be UTF-8, as [`replace`] does
/// on the lossily decoded text (so `old` may hold U+FFFD where the file has invalid bytes), and
/// returns the new bytes. Only the part of each match that `new` changes is rewritten, so
/// invalid bytes inside the unchanged start and end of `old` are kept as they are, and every
/// byte outside the matches too. Refuses (changing nothing) when the changed part covers
/// invalid bytes and `new` puts U+FFFD there, since U+FFFD cannot stand for the original bytes.
pub fn replace_bytes(
    path: &str,
    bytes: &[u8],
    old: &str,
    new: &str,
    replace_all: bool,
) -> Result<(Vec<u8>, usize), BackendError> {
    check_old(old)?;
    let decoded = Decoded::new(bytes);
    let starts: Vec<usize> = decoded.text.match_indices(old).map(|(at, _)| at).collect();
    match starts.len() {
        0 => {
            return Err(BackendError::StringNotFound {
                path: path.to_owned(),
            });
        }
        1 => {}
        _ if replace_all => {}
        count => {
            return Err(BackendError::NotUnique {
                path: path.to_owned(),
                count,
            });
        }
    }
    let (prefix, suffix) = common_affixes(old, new);
    let changed = &new[prefix..new.len() - suffix];
    let mut out = Vec::with_capacity(bytes.len() + new.len().saturating_sub(old.len()));
    let mut copied = 0;
    for start in &starts {
        let from = decoded.raw_offset(start + prefix);
        let to = decoded.raw_offset(start + old.len() - suffix);
        if changed.contains('\u{FFFD}') && decoded.has_invalid(from, to) {
            return Err(BackendError::NotUtf8 {
                path: path.to_owned(),
                reason: "the part of the text this edit changes holds such bytes, and U+FFFD in \
                         the replacement cannot reproduce them. Change a smaller span that leaves \
                         them out, or delete the file and write it again with write_file"
                    .to_owned(),
            });
        }
        out.extend_from_slice(&bytes[copied..from]);
        out.extend_from_slice(changed.as_bytes());
        copied = to;
    }
    out.extend_from_slice(&bytes[copied..]);
    Ok((out, starts.len()))
}

/// The byte lengths of the longest common start and end of `a` and `b` (whole characters, not
/// overlapping).
fn common_affixes(a: &str, b: &str) -> (usize, usize) {
    let prefix: usize = a
        .chars()
        .zip(b.chars())
        .take_while(|(x, y)| x == y)
        .map(|(x, _)| x.len_utf8())
        .sum();
    let suffix = a[prefix..]
        .chars()
        .rev()
        .zip(b[prefix..].chars().rev())
        .take_while(|(x, y)| x == y)
        .map(|(x, _)| x.len_utf8())
        .sum();
    (prefix, suffix)
}

/// Bytes decoded lossily, with the way back from decoded offsets to byte offsets.
struct Decoded {
    text: String,
    /// Runs in order: (decoded start, raw start, whether the run is one U+FFFD for invalid
    /// bytes). A valid run has the same length decoded and raw.
    runs: Vec<(usize, usize, bool)>,
    /// The length of the bytes.
    raw_len: usize,
}

impl Decoded {
    fn new(bytes: &[u8]) -> Self {
        let mut text = String::with_capacity(bytes.len());
        let mut runs = Vec::new();
        let mut raw = 0;
        // The same chunks, and so the same U+FFFD, as `String::from_utf8_lossy`.
        for chunk in bytes.utf8_chunks() {
            if !chunk.valid().is_empty() {
                runs.push((text.len(), raw, false));
                text.push_str(chunk.valid());
                raw += chunk.valid().len();
            }
            if !chunk.invalid().is_empty() {
                runs.push((text.len(), raw, true));
                text.push('\u{FFFD}');
                raw += chunk.invalid().len();
            }
        }
        Self {
            text,
            runs,
            raw_len: bytes.len(),
        }
    }

    /// The byte offset of decoded offset `at`, a character boundary: inside a valid run, or at
    /// the start of a U+FFFD (never inside one, a single character).
    fn raw_offset(&self, at: usize) -> usize {
        let index = self.runs.partition_point(|&(start, _, _)| start <= at);
        match index.checked_sub(1).and_then(|i| self.runs.get(i)) {
            Some(&(start, raw, false)) => raw + (at - start),
            Some(&(start, raw, true)) if at == start => raw,
            // Just past a U+FFFD that ends the text (anywhere else the next run starts there).
            Some(&(_, _, true)) => self.raw_len,
            None => 0,
        }
    }

    /// Whether invalid bytes start within `from..to`.
    fn has_invalid(&self, from: usize, to: usize) -> bool {
        self.runs
            .iter()
            .any(|&(_, raw, invalid)| invalid && raw >= from && raw < to)
    }
}

/// A compiled grep query for text held in memory, matched byte-wise like the disk backend's
/// searcher, so text that is not UTF-8 is searched too.
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
        self.search_bytes(path, text.as_bytes(), out, max)
    }

    /// [`Self::search`] over text held as bytes; matching lines show invalid UTF-8 as U+FFFD.
    pub fn search_bytes(
        &self,
        path: &str,
        bytes: &[u8],
        out: &mut Vec<GrepMatch>,
        max: usize,
    ) -> bool {
        for (index, line) in byte_lines(bytes).enumerate() {
            if self.regex.is_match(line) {
                if out.len() >= max {
                    return true;
                }
                out.push(GrepMatch {
                    path: path.to_owned(),
                    line_number: index + 1,
                    line: lossy(line),
                });
            }
        }
        false
    }
}
