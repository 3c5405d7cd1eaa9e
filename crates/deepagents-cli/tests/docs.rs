//! The documentation against the binary: every long flag of `deepagents` (of any command) is
//! named in README.md or a page of docs/, and every `--flag` those pages name is one of the
//! binary's or of another tool on a short list. Also: the README links every page of docs/, and
//! every page is compiled by the `deepagents` doc tests (so its Rust blocks build and its other
//! blocks name their language).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::bin;

/// Flags of other tools that the docs show. Keep it short: a flag of ours belongs to the CLI,
/// and an entry no page uses any more is an error too.
const OTHER_TOOLS: &[&str] = &[
    // cargo: `cargo install --path … --locked`, `cargo test --workspace --doc`, `cargo build
    // --release` / `--profile profiling`, `cargo bench --bench … --features …`, `cargo fmt
    // --check`.
    "locked",
    "workspace",
    "doc",
    "path",
    "release",
    "profile",
    "bench",
    "features",
    "check",
    // npm: `npm install --prefix DIR`.
    "prefix",
    // mypy --strict (python/run-tests); git cat-file --batch (docs/ARCHITECTURE.md).
    "strict",
    "batch",
    // The options of bench/server.sh and bench/harness.sh.
    "runs",
    "delay",
    "reps",
    "quick",
    "checkpoint",
    // `langgraph dev`'s, which bench/server.sh runs for the reference stack.
    "n-jobs-per-worker",
];

/// Flags every command has, which no page needs to name.
const IMPLICIT: &[&str] = &["help", "version"];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and every page of docs/, with their text.
fn pages() -> Vec<(String, String)> {
    let root = workspace_root();
    let mut pages = vec![(
        "README.md".to_owned(),
        std::fs::read_to_string(root.join("README.md")).unwrap(),
    )];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    for path in docs {
        let name = format!("docs/{}", path.file_name().unwrap().to_string_lossy());
        pages.push((name, std::fs::read_to_string(&path).unwrap()));
    }
    pages
}

/// The `--name` tokens in `text`: two dashes after a character that is not part of a word or
/// of a longer run of dashes, then a lowercase letter, then letters, digits and dashes.
fn long_flags(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i + 2 < bytes.len() {
        let starts = bytes[i] == b'-'
            && bytes[i + 1] == b'-'
            && bytes[i + 2].is_ascii_lowercase()
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'-'));
        if !starts {
            i += 1;
            continue;
        }
        let mut end = i + 2;
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'-')
        {
            end += 1;
        }
        found.push(text[i + 2..end].trim_end_matches('-').to_owned());
        i = end;
    }
    found
}

/// `deepagents <command…> --help`.
fn help(command: &[String]) -> String {
    let output = bin().args(command).arg("--help").output().unwrap();
    assert!(
        output.status.success(),
        "`deepagents {} --help` failed: {}",
        command.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The subcommands a help text lists under `Commands:` (but `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// The long flags a help text lists: lines that start (indented by less than the help's
/// descriptions) with `-`, up to the two spaces before their one-line help.
fn options(help: &str) -> Vec<String> {
    help.lines()
        .filter(|line| {
            let indent = line.len() - line.trim_start().len();
            (1..8).contains(&indent) && line.trim_start().starts_with('-')
        })
        .flat_map(|line| long_flags(line.trim_start().split("  ").next().unwrap_or_default()))
        .collect()
}

/// Every long flag of the binary, with the first command that has it, walking the commands
/// their help lists.
fn cli_flags() -> BTreeMap<String, String> {
    let mut flags = BTreeMap::new();
    let mut queue = vec![Vec::<String>::new()];
    while let Some(command) = queue.pop() {
        let text = help(&command);
        for flag in options(&text) {
            flags
                .entry(flag)
                .or_insert_with(|| format!("deepagents {}", command.join(" ")));
        }
        for sub in subcommands(&text) {
            let mut next = command.clone();
            next.push(sub);
            queue.push(next);
        }
    }
    flags
}

#[test]
fn the_flag_scanner_reads_words_not_dashes() {
    assert_eq!(
        long_flags("`-r/--resume ID`, --max-cost USD; |---|---| a--b --- -- COMMAND --x-"),
        ["resume", "max-cost", "x"]
    );
    let help = "Usage: deepagents run [OPTIONS]\n\nCommands:\n  list  List\n  help  Print\n\n\
                Options:\n      --model <MODEL>\n          Beats --config\n  -q, --quiet  Only\n";
    assert_eq!(subcommands(help), ["list"]);
    assert_eq!(options(help), ["model", "quiet"]);
}

/// Every flag of every command is documented, and the docs name no flag the CLI lacks.
#[test]
fn the_docs_name_every_flag_and_only_real_ones() {
    let cli = cli_flags();
    assert!(
        cli.contains_key("model") && cli.contains_key("listen") && cli.contains_key("json"),
        "the walk over the commands' help missed flags: {cli:?}"
    );
    let mut named: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (page, text) in pages() {
        for flag in long_flags(&text) {
            named.entry(flag).or_default().insert(page.clone());
        }
    }
    let undocumented: Vec<String> = cli
        .iter()
        .filter(|(flag, _)| !named.contains_key(*flag) && !IMPLICIT.contains(&flag.as_str()))
        .map(|(flag, command)| format!("--{flag} (of `{command}`)"))
        .collect();
    let unknown: Vec<String> = named
        .iter()
        .filter(|(flag, _)| {
            !cli.contains_key(*flag)
                && !OTHER_TOOLS.contains(&flag.as_str())
                && !IMPLICIT.contains(&flag.as_str())
        })
        .map(|(flag, pages)| {
            format!(
                "--{flag} (in {})",
                pages.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect();
    let unused: Vec<&str> = OTHER_TOOLS
        .iter()
        .copied()
        .filter(|flag| !named.contains_key(*flag) || cli.contains_key(*flag))
        .collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty() && unused.is_empty(),
        "\nflags of the CLI that no page of README.md or docs/ names:\n  {}\n\
         flags the pages name that the CLI does not have (a typo, a removed flag, or another \
         tool's: then add it to OTHER_TOOLS in tests/docs.rs):\n  {}\n\
         OTHER_TOOLS entries no page uses or that are the CLI's own:\n  {}\n",
        undocumented.join("\n  "),
        unknown.join("\n  "),
        unused.join("\n  "),
    );
}

/// The README's map links every page of docs/, and the `deepagents` doc tests compile each.
#[test]
fn every_docs_page_is_linked_and_compiled() {
    let root = workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let lib = std::fs::read_to_string(root.join("crates/deepagents/src/lib.rs")).unwrap();
    let mut problems = Vec::new();
    for (page, _) in pages().into_iter().skip(1) {
        if !readme.contains(&format!("]({page})")) {
            problems.push(format!("README.md does not link {page}"));
        }
        if !lib.contains(&format!("include_str!(\"../../../{page}\")")) {
            problems.push(format!(
                "{page} is not compiled by the doc tests (include_str! in crates/deepagents/src/lib.rs)"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
