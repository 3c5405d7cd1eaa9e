//! File tools over a [`Backend`]: ls, read_file, write_file, edit_file, delete, glob, grep.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use deepagents_backends::{
    Backend, BackendContext, BackendError, BrokenLink, DEFAULT_GREP_MAX_COUNT, GrepQuery,
    ReadResult, SkipReason, SkippedFile, VPath,
};
use deepagents_core::{ContentBlock, StateUpdate, Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

use super::output::{OUTPUT_CAP, capped_lines, truncate_chars};

/// Lines `read_file` returns when the model gives no limit.
pub(crate) const DEFAULT_READ_LIMIT: usize = 500;
/// Lines longer than this continue on rows `N.1`, `N.2`, …
pub(crate) const LINE_ROW_CHARS: usize = 5_000;
/// The smallest page cap in characters, however small the window.
const MIN_PAGE_CHARS: usize = 2_000;

/// The characters one `read_file` page may hold for a model whose window holds
/// `window_tokens`: a quarter of the window (at four characters a token, as context
/// accounting estimates), at most [`OUTPUT_CAP`] — so only windows under 80,000 tokens get
/// smaller pages, and one default read cannot fill a small model's window.
pub(crate) fn page_chars(window_tokens: u64) -> usize {
    usize::try_from(window_tokens)
        .unwrap_or(usize::MAX)
        .clamp(MIN_PAGE_CHARS, OUTPUT_CAP)
}

/// The context a backend call runs with, derived from the tool's.
pub(crate) fn backend_context(ctx: &ToolContext) -> BackendContext {
    let mut context = BackendContext::for_run(&ctx.run, Arc::clone(&ctx.state));
    context.call_id = Some(ctx.call_id.clone());
    context
}

/// A backend error as the model should see it.
pub(crate) fn to_model(error: BackendError) -> ToolError {
    ToolError::RespondToModel(error.to_string())
}

pub(crate) fn parse_path(raw: &str) -> Result<VPath, ToolError> {
    VPath::parse(raw).map_err(|e| to_model(e.into()))
}

/// `ls`.
pub(crate) struct Ls(pub(crate) Arc<dyn Backend>);

/// Arguments of `ls`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct LsArgs {
    /// Absolute directory path, e.g. `/` or `/src`.
    #[serde(default = "root")]
    path: String,
}

fn root() -> String {
    "/".to_owned()
}

impl Tool for Ls {
    type Args = LsArgs;

    fn name(&self) -> &str {
        "ls"
    }

    fn description(&self) -> String {
        "List the entries directly inside a directory (absolute path, default `/`). Directories \
         end with `/`; files show their size; a symlink that cannot be followed shows `->` and \
         why. Use glob to find files at any depth."
            .to_owned()
    }

    async fn call(&self, args: LsArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let path = parse_path(&args.path)?;
        let entries = self
            .0
            .ls(&backend_context(&ctx), &path)
            .await
            .map_err(to_model)?;
        if entries.is_empty() {
            return Ok(ToolOutput::text(format!("{path} is empty.")));
        }
        let total = entries.len();
        let lines = entries.into_iter().map(|entry| match entry.broken_link {
            // Its size and kind mean nothing; shown as a 0-byte file it would pass for one.
            Some(BrokenLink::OutsideRoot) => format!(
                "{} -> (symlink leading outside the workspace; not followed)",
                entry.path
            ),
            Some(BrokenLink::Unresolvable) => format!(
                "{} -> (symlink that cannot be followed: missing target, a loop, or links are off)",
                entry.path
            ),
            None if entry.is_dir => format!("{}/", entry.path),
            None => format!("{} ({} bytes)", entry.path, entry.size),
        });
        Ok(ToolOutput::text(capped_lines(lines, |omitted| {
            format!("[{omitted} of {total} entries not shown; list a subdirectory or use glob.]")
        })))
    }
}

/// `read_file`, with its page cap in characters ([`page_chars`]).
pub(crate) struct ReadFile(pub(crate) Arc<dyn Backend>, pub(crate) usize);

/// Arguments of `read_file`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadFileArgs {
    /// Absolute path of the file.
    file_path: String,
    /// 0-based line to start at.
    #[serde(default)]
    offset: usize,
    /// Lines to return (default 500).
    #[serde(default)]
    limit: Option<usize>,
    /// Continuation row of the line at `offset` to start at (`N.K` is row K), when a note says so.
    #[serde(default)]
    row: usize,
}

impl Tool for ReadFile {
    type Args = ReadFileArgs;

    fn name(&self) -> &str {
        "read_file"
    }

    fn description(&self) -> String {
        let cap = self.1;
        format!(
            "Read a file. Text comes back as numbered lines (`N<TAB>text`), {DEFAULT_READ_LIMIT} \
             lines from `offset` (0-based) unless `limit` says otherwise, at most {cap} \
             characters per call; lines over {LINE_ROW_CHARS} characters continue on rows `N.1`, \
             `N.2`. A note gives the `offset` (and inside a long line the `row`) to continue \
             from; paging that way reaches every character. Images and PDFs come back as \
             content you can see."
        )
    }

    async fn call(&self, args: ReadFileArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let path = parse_path(&args.file_path)?;
        let limit = args.limit.unwrap_or(DEFAULT_READ_LIMIT).max(1);
        let read = self
            .0
            .read(&backend_context(&ctx), &path, args.offset, limit)
            .await
            .map_err(to_model)?;
        match read {
            ReadResult::Binary { mime_type, data } => Ok(binary_output(
                &path,
                mime_type,
                data,
                self.0.as_sandbox().is_some(),
            )),
            ReadResult::Text {
                lines,
                offset,
                total_lines,
            } => {
                if total_lines == 0 {
                    return Ok(ToolOutput::text(format!("{path} is empty.")));
                }
                if offset >= total_lines {
                    return Err(ToolError::RespondToModel(format!(
                        "offset {offset} is past the end of {path}, which has {total_lines} lines; use an offset below {total_lines}."
                    )));
                }
                numbered(&path, &lines, offset, args.row, total_lines, self.1).map(ToolOutput::text)
            }
        }
    }
}

/// Whether models can take this media type as content.
fn viewable(mime_type: &str) -> bool {
    mime_type.starts_with("image/")
        || mime_type.starts_with("audio/")
        || mime_type.starts_with("video/")
        || mime_type == "application/pdf"
}

/// A binary file as the model sees it. `shell`: whether the agent has `execute` (only then is
/// a command worth suggesting).
fn binary_output(path: &VPath, mime_type: String, data: Vec<u8>, shell: bool) -> ToolOutput {
    let size = data.len();
    if viewable(&mime_type) {
        ToolOutput::blocks(vec![
            ContentBlock::text(format!("{path} ({mime_type}, {size} bytes):")),
            ContentBlock::data(mime_type, data),
        ])
    } else {
        let hint = if shell {
            " Inspect it with a command through execute (e.g. `file` or `xxd`) if you must."
        } else {
            ""
        };
        ToolOutput::text(format!(
            "{path} is a binary file ({mime_type}, {size} bytes) and cannot be shown as text.{hint}"
        ))
    }
}

/// The rows a line is shown on: pieces of at most [`LINE_ROW_CHARS`] characters (one empty row
/// for an empty line).
fn rows(line: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(line);
    std::iter::from_fn(move || {
        let current = rest?;
        let chunk = truncate_chars(current, LINE_ROW_CHARS);
        let remainder = &current[chunk.len()..];
        rest = (!remainder.is_empty()).then_some(remainder);
        Some(chunk)
    })
}

/// Numbered rows of a page, starting at continuation row `first_row` of the first line, capped
/// at `cap` characters, with a note giving the exact position to continue from: paging by the
/// notes reaches every character of the file.
fn numbered(
    path: &VPath,
    lines: &[String],
    offset: usize,
    first_row: usize,
    total_lines: usize,
    cap: usize,
) -> Result<String, ToolError> {
    if first_row > 0 {
        let available = lines.first().map_or(1, |line| rows(line).count());
        if first_row >= available {
            let number = offset + 1;
            let last = match available {
                1 => format!("only row {number}"),
                n => format!("rows {number} to {number}.{}", n - 1),
            };
            return Err(ToolError::RespondToModel(format!(
                "row {first_row} is past the end of line {number} of {path}, which has {last}; use a row below {available}, or row 0."
            )));
        }
    }
    let width = (offset + lines.len()).to_string().len().max(6);
    let mut out = String::new();
    // Where the next page starts when this one is full: (0-based line, row).
    let mut resume = None;
    'lines: for (i, line) in lines.iter().enumerate() {
        let number = offset + i + 1;
        let skip = if i == 0 { first_row } else { 0 };
        for (row, chunk) in rows(line).enumerate().skip(skip) {
            let label = if row == 0 {
                number.to_string()
            } else {
                format!("{number}.{row}")
            };
            let entry = format!("{label:>width$}\t{chunk}\n");
            // A row is far smaller than the cap, so every page shows at least one.
            if !out.is_empty() && out.len() + entry.len() > cap {
                resume = Some((offset + i, row));
                break 'lines;
            }
            out.push_str(&entry);
        }
    }
    let first = offset + 1;
    match resume {
        Some((line, row)) if row > 0 => {
            let number = line + 1;
            let _ = write!(
                out,
                "\n[Lines {first}-{number} of {total_lines} shown from {path}; line {number} goes on at row {number}.{row}. Continue with offset={line} and row={row}.]"
            );
        }
        _ => {
            let next = resume.map_or(offset + lines.len(), |(line, _)| line);
            if next < total_lines {
                let _ = write!(
                    out,
                    "\n[Lines {first}-{next} of {total_lines} shown from {path}; {} more. Continue with offset={next}.]",
                    total_lines - next
                );
            }
        }
    }
    Ok(out)
}

/// `write_file`: creates a file, never replaces one ([`Backend::write`] is create-only).
pub(crate) struct WriteFile(pub(crate) Arc<dyn Backend>);

/// Arguments of `write_file`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WriteFileArgs {
    /// Absolute path of the file; parent directories are created.
    file_path: String,
    /// The file's content.
    content: String,
}

impl Tool for WriteFile {
    type Args = WriteFileArgs;

    fn name(&self) -> &str {
        "write_file"
    }

    fn description(&self) -> String {
        "Create a new file; parent directories are created. It fails if the file exists: \
         change an existing file with edit_file, or delete it first to replace it whole."
            .to_owned()
    }

    fn is_mutating(&self) -> bool {
        true
    }

    async fn call(&self, args: WriteFileArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let path = parse_path(&args.file_path)?;
        let changed = self
            .0
            .write(&backend_context(&ctx), &path, &args.content)
            .await
            .map_err(to_model)?;
        let lines = deepagents_backends::text::lines(&args.content).count();
        Ok(change_output(
            format!(
                "Wrote {path} ({lines} lines, {} bytes).",
                args.content.len()
            ),
            &path,
            changed.update,
        ))
    }
}

/// The output of a call that changed `path`: in the agent state (`update`), or outside it
/// (on disk, in a store), which the driver is told so that same-step conflicts are noted.
fn change_output(text: String, path: &VPath, update: StateUpdate) -> ToolOutput {
    let outside = update.files.is_empty().then(|| path.to_string());
    ToolOutput::text(text)
        .with_update(update)
        .with_changed_files(outside)
}

/// `edit_file`.
pub(crate) struct EditFile(pub(crate) Arc<dyn Backend>);

/// Arguments of `edit_file`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EditFileArgs {
    /// Absolute path of the file.
    file_path: String,
    /// Exact text to replace, including whitespace; must occur once unless replace_all.
    old_string: String,
    /// The replacement.
    new_string: String,
    /// Replace every occurrence instead of exactly one.
    #[serde(default)]
    replace_all: bool,
}

impl Tool for EditFile {
    type Args = EditFileArgs;

    fn name(&self) -> &str {
        "edit_file"
    }

    fn description(&self) -> String {
        "Replace exact text in a file. `old_string` must match the file exactly (copy it from \
         read_file output without the line numbers) and occur once, unless `replace_all` is \
         true."
            .to_owned()
    }

    fn is_mutating(&self) -> bool {
        true
    }

    async fn call(&self, args: EditFileArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let path = parse_path(&args.file_path)?;
        let changed = self
            .0
            .edit(
                &backend_context(&ctx),
                &path,
                &args.old_string,
                &args.new_string,
                args.replace_all,
            )
            .await
            .map_err(to_model)?;
        let count = changed.value;
        let plural = if count == 1 { "" } else { "s" };
        Ok(change_output(
            format!("Replaced {count} occurrence{plural} in {path}."),
            &path,
            changed.update,
        ))
    }
}

/// `delete`.
pub(crate) struct Delete(pub(crate) Arc<dyn Backend>);

/// Arguments of `delete`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeleteArgs {
    /// Absolute path of a file or directory; directories are deleted with everything inside.
    path: String,
}

impl Tool for Delete {
    type Args = DeleteArgs;

    fn name(&self) -> &str {
        "delete"
    }

    fn description(&self) -> String {
        "Delete a file, or a directory with everything inside it. This cannot be undone.".to_owned()
    }

    fn is_mutating(&self) -> bool {
        true
    }

    async fn call(&self, args: DeleteArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let path = parse_path(&args.path)?;
        let changed = self
            .0
            .delete(&backend_context(&ctx), &path)
            .await
            .map_err(to_model)?;
        let count = changed.value;
        let plural = if count == 1 { "" } else { "s" };
        Ok(change_output(
            format!("Deleted {path} ({count} file{plural})."),
            &path,
            changed.update,
        ))
    }
}

/// `glob`.
pub(crate) struct Glob(pub(crate) Arc<dyn Backend>);

/// Arguments of `glob`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct GlobArgs {
    /// Glob such as `*.py` (any depth), `src/**/*.rs` or `*.{md,txt}`.
    pattern: String,
    /// Absolute directory to search from (default `/`).
    #[serde(default = "root")]
    path: String,
}

impl Tool for Glob {
    type Args = GlobArgs;

    fn name(&self) -> &str {
        "glob"
    }

    fn description(&self) -> String {
        "Find files by name. A pattern without `/` matches file names at any depth (`*.py`); \
         with `/` it matches paths from `path` (`src/**/*.rs`). Supports `**`, `{a,b}`, `[ab]`. \
         Hidden files match only when the pattern names them (`**/.env`). Returns paths sorted."
            .to_owned()
    }

    async fn call(&self, args: GlobArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let base = parse_path(&args.path)?;
        let result = self
            .0
            .glob(&backend_context(&ctx), &args.pattern, &base)
            .await
            .map_err(to_model)?;
        if result.files.is_empty() {
            let more = if result.truncated {
                " The search stopped early (time limit), so narrow `path` and try again."
            } else {
                ""
            };
            return Ok(ToolOutput::text(format!(
                "No files match `{}` under {base}.{more}",
                args.pattern
            )));
        }
        let total = result.files.len();
        let mut text = capped_lines(result.files.into_iter().map(|f| f.path), |omitted| {
            format!("[{omitted} of {total} paths not shown; use a narrower pattern or path.]")
        });
        if result.truncated {
            text.push_str("\n[The search stopped early; more files may match. Narrow `path`.]");
        }
        Ok(ToolOutput::text(text))
    }
}

/// How grep reports.
#[derive(Clone, Copy, Debug, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum GrepOutput {
    /// Paths of files with a match.
    #[default]
    FilesWithMatches,
    /// Matching lines with line numbers, grouped by file.
    Content,
    /// Matches per file.
    Count,
}

/// `grep`.
pub(crate) struct Grep(pub(crate) Arc<dyn Backend>);

/// Arguments of `grep`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct GrepArgs {
    /// Text to find. Literal unless `regex` is true.
    pattern: String,
    /// Absolute file or directory to search (default `/`).
    #[serde(default = "root")]
    path: String,
    /// Only files whose name or relative path matches this glob, e.g. `*.rs`.
    #[serde(default)]
    glob: Option<String>,
    /// files_with_matches (default), content (lines with numbers) or count.
    #[serde(default)]
    output_mode: GrepOutput,
    /// Treat `pattern` as a regular expression.
    #[serde(default)]
    regex: bool,
    /// Ignore case.
    #[serde(default)]
    case_insensitive: bool,
    /// Most matching lines to collect (default 1000).
    #[serde(default)]
    max_count: Option<usize>,
}

impl Tool for Grep {
    type Args = GrepArgs;

    fn name(&self) -> &str {
        "grep"
    }

    fn description(&self) -> String {
        format!(
            "Search file contents. The pattern is literal text unless `regex` is true. \
             output_mode: files_with_matches (default), content (`path:` then `N: line`), or \
             count. Stops after max_count matching lines (default {DEFAULT_GREP_MAX_COUNT}) and \
             says so. Binary files are skipped."
        )
    }

    async fn call(&self, args: GrepArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let query = GrepQuery {
            pattern: args.pattern.clone(),
            regex: args.regex,
            case_insensitive: args.case_insensitive,
            path: parse_path(&args.path)?,
            include: args.glob,
            max_count: args.max_count.unwrap_or(DEFAULT_GREP_MAX_COUNT).max(1),
        };
        let result = self
            .0
            .grep(&backend_context(&ctx), &query)
            .await
            .map_err(to_model)?;
        if result.matches.is_empty() {
            let mut text = format!("No matches for `{}` under {}.", args.pattern, query.path);
            if !args.regex && looks_like_regex(&args.pattern) {
                text.push_str(
                    " The pattern was searched as literal text but looks like a regular expression; set regex=true to use it as one.",
                );
            }
            push_skipped(&mut text, &result.skipped);
            return Ok(ToolOutput::text(text));
        }
        let mut by_file: BTreeMap<String, Vec<(usize, String)>> = BTreeMap::new();
        for found in result.matches {
            by_file
                .entry(found.path)
                .or_default()
                .push((found.line_number, found.line));
        }
        let lines: Vec<String> = match args.output_mode {
            GrepOutput::FilesWithMatches => by_file.into_keys().collect(),
            GrepOutput::Count => by_file
                .into_iter()
                .map(|(path, hits)| format!("{path}: {}", hits.len()))
                .collect(),
            GrepOutput::Content => by_file
                .into_iter()
                .flat_map(|(path, hits)| {
                    std::iter::once(format!("{path}:")).chain(hits.into_iter().map(
                        |(number, line)| {
                            format!("{number:>6}: {}", truncate_chars(&line, LINE_ROW_CHARS / 2))
                        },
                    ))
                })
                .collect(),
        };
        let mut text = capped_lines(lines, |omitted| {
            format!("[{omitted} more lines not shown; narrow the search with path or glob.]")
        });
        if result.truncated {
            let _ = write!(
                text,
                "\n[Stopped after {} matching lines; more may exist. Narrow the search with path or glob.]",
                query.max_count
            );
        }
        push_skipped(&mut text, &result.skipped);
        Ok(ToolOutput::text(text))
    }
}

/// Files named in a skipped-files note; the rest are counted.
const SKIPPED_NAMED: usize = 20;

/// Appends notes naming the files grep did not search and why, so a missing match is never
/// silent.
fn push_skipped(text: &mut String, skipped: &[SkippedFile]) {
    let (binary, unreadable): (Vec<&SkippedFile>, Vec<&SkippedFile>) = skipped
        .iter()
        .partition(|s| matches!(s.reason, SkipReason::Binary { .. }));
    if !binary.is_empty() {
        let names = named(binary.iter().map(|s| s.path.clone()));
        let count = binary.len();
        let plural = if count == 1 { "" } else { "s" };
        let _ = write!(
            text,
            "\n[Skipped {count} binary file{plural} (not searched): {names}.]"
        );
    }
    if !unreadable.is_empty() {
        let names = named(
            unreadable
                .iter()
                .map(|s| format!("{} ({})", s.path, s.reason)),
        );
        let count = unreadable.len();
        let plural = if count == 1 { "" } else { "s" };
        let _ = write!(text, "\n[Could not search {count} path{plural}: {names}.]");
    }
}

/// The first [`SKIPPED_NAMED`] of `items` joined, then how many more.
fn named(items: impl ExactSizeIterator<Item = String>) -> String {
    let total = items.len();
    let mut shown: Vec<String> = items.take(SKIPPED_NAMED).collect();
    if total > SKIPPED_NAMED {
        shown.push(format!("and {} more", total - SKIPPED_NAMED));
    }
    shown.join(", ")
}

/// Whether a pattern searched literally was probably meant as a regex.
fn looks_like_regex(pattern: &str) -> bool {
    [
        ".*", ".+", "\\d", "\\w", "\\s", "\\b", "[", "(", "|", "^", "$", "+", "?", "{",
    ]
    .iter()
    .any(|marker| pattern.contains(marker))
}
