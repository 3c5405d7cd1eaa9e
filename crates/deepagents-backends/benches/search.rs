//! grep and glob of the filesystem backend against the `rg` binary on the same tree, in the
//! same run, alternating runs so caches and load affect both alike. Not a test: it prints
//! medians and ratios. Run through `bench/search.sh`, which builds the 100,000-file tree.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use deepagents_backends::{Backend, BackendContext, FilesystemBackend, GrepQuery, VPath};

const RUNS: usize = 7;

enum Ours {
    Grep(GrepQuery),
    Glob(&'static str),
}

struct Case {
    name: &'static str,
    ours: Ours,
    rg: Vec<String>,
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn run_rg(args: &[String], tree: &Path) -> (Duration, usize) {
    let started = Instant::now();
    // Captured through a pipe: rg stops at the first match when stdout is /dev/null.
    // Run from the tree so rg's `-g` globs are relative to it, as ours are to the base.
    let output = Command::new("rg")
        .args(args)
        .arg(".")
        .current_dir(tree)
        .output()
        .expect("rg runs");
    let elapsed = started.elapsed();
    assert!(
        output.status.code().is_some_and(|c| c <= 1),
        "rg failed: {output:?}"
    );
    (
        elapsed,
        output
            .stdout
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .count(),
    )
}

fn main() {
    let tree: PathBuf = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .unwrap_or_else(|| "/tmp/deepagents-search-bench".into())
        .into();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let backend = FilesystemBackend::builder(&tree)
        .create_root(false)
        .search_timeout(Duration::from_secs(600))
        .build()
        .unwrap();
    let cx = BackendContext::default();
    let root = VPath::root();
    let common = ["--no-config", "--no-ignore", "--hidden", "-g", "!.git"].map(String::from);
    let rg = |extra: &[&str]| -> Vec<String> {
        common
            .iter()
            .cloned()
            .chain(extra.iter().map(|s| (*s).to_owned()))
            .collect()
    };
    let unlimited = |query: GrepQuery| GrepQuery {
        max_count: usize::MAX / 2,
        ..query
    };
    let cases = vec![
        Case {
            name: "grep literal, rare (~100 hits)",
            ours: Ours::Grep(unlimited(GrepQuery::literal("needle_marker", root.clone()))),
            rg: rg(&["-n", "-F", "needle_marker"]),
        },
        Case {
            name: "grep regex, rare",
            ours: Ours::Grep(unlimited(GrepQuery {
                regex: true,
                ..GrepQuery::literal(r"needle_\w+ = compute\(\d+\)", root.clone())
            })),
            rg: rg(&["-n", r"needle_\w+ = compute\(\d+\)"]),
        },
        Case {
            name: "grep literal -i, common",
            ours: Ours::Grep(unlimited(GrepQuery {
                case_insensitive: true,
                ..GrepQuery::literal("OMEGA PSI", root.clone())
            })),
            rg: rg(&["-n", "-F", "-i", "OMEGA PSI"]),
        },
        Case {
            name: "grep cap 1,000 (rg: -m per file)",
            ours: Ours::Grep(GrepQuery::literal("omega psi", root.clone())),
            rg: rg(&["-n", "-F", "-m", "1000", "omega psi"]),
        },
        Case {
            name: "glob *.rs",
            ours: Ours::Glob("*.rs"),
            rg: rg(&["--files", "-g", "*.rs"]),
        },
        Case {
            name: "glob *.zzz (walk only)",
            ours: Ours::Glob("*.zzz"),
            rg: rg(&["--files", "-g", "*.zzz"]),
        },
        Case {
            name: "glob pkg01*/**/*.md",
            ours: Ours::Glob("pkg01*/**/*.md"),
            rg: rg(&["--files", "-g", "pkg01*/**/*.md"]),
        },
    ];
    println!(
        "{:<32} {:>10} {:>10} {:>7} {:>9} {:>9}",
        "case", "ours ms", "rg ms", "ratio", "ours hits", "rg hits"
    );
    for case in cases {
        let mut ours_times = Vec::new();
        let mut rg_times = Vec::new();
        let mut ours_hits = 0;
        let mut rg_hits = 0;
        for run in 0..=RUNS {
            let started = Instant::now();
            ours_hits = match &case.ours {
                Ours::Grep(query) => {
                    let result = runtime.block_on(backend.grep(&cx, query)).unwrap();
                    result.matches.len()
                }
                Ours::Glob(pattern) => {
                    let result = runtime.block_on(backend.glob(&cx, pattern, &root)).unwrap();
                    result.files.len()
                }
            };
            let ours = started.elapsed();
            let (theirs, hits) = run_rg(&case.rg, &tree);
            rg_hits = hits;
            // The first round only warms the page cache.
            if run > 0 {
                ours_times.push(ours);
                rg_times.push(theirs);
            }
        }
        let (ours, theirs) = (median(ours_times), median(rg_times));
        println!(
            "{:<32} {:>10.1} {:>10.1} {:>6.2}x {:>9} {:>9}",
            case.name,
            ours.as_secs_f64() * 1e3,
            theirs.as_secs_f64() * 1e3,
            ours.as_secs_f64() / theirs.as_secs_f64(),
            ours_hits,
            rg_hits
        );
    }
}
