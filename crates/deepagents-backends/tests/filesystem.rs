//! The disk backend: every operation on a real directory, search over a real tree, properties.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use deepagents_backends::{
    Backend, BackendContext, BackendError, BrokenLink, FileOpError, FilesystemBackend, GrepQuery,
    InMemoryStore, ReadResult, StateBackend, StoreBackend, VPath,
};
use proptest::prelude::*;
use tempfile::TempDir;

use crate::conformance::{Harness, check_backend, check_mounted};

fn p(path: &str) -> VPath {
    VPath::parse(path).unwrap()
}

fn cx() -> BackendContext {
    BackendContext::default()
}

/// A temp dir with `root/` (the backend) beside it.
fn setup() -> (TempDir, FilesystemBackend) {
    let tmp = TempDir::new().unwrap();
    let backend = FilesystemBackend::new(tmp.path().join("root")).unwrap();
    (tmp, backend)
}

fn put(root: &Path, rel: &str, content: impl AsRef<[u8]>) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

async fn text(b: &FilesystemBackend, path: &str) -> Vec<String> {
    match b.read(&cx(), &p(path), 0, usize::MAX).await.unwrap() {
        ReadResult::Text { lines, .. } => lines,
        other => panic!("{path} is not text: {other:?}"),
    }
}

async fn glob(b: &FilesystemBackend, pattern: &str, base: &str) -> Vec<String> {
    let result = b.glob(&cx(), pattern, &p(base)).await.unwrap();
    assert!(!result.truncated);
    result.files.into_iter().map(|f| f.path).collect()
}

async fn grep(b: &FilesystemBackend, query: GrepQuery) -> (Vec<String>, bool) {
    let result = b.grep(&cx(), &query).await.unwrap();
    let found = result
        .matches
        .into_iter()
        .map(|m| format!("{}:{}:{}", m.path, m.line_number, m.line))
        .collect();
    (found, result.truncated)
}

#[tokio::test]
async fn conformance_filesystem() {
    let (_tmp, backend) = setup();
    check_backend(Arc::new(backend)).await;
}

#[tokio::test]
async fn conformance_filesystem_mounted_in_a_composite() {
    let (_tmp, backend) = setup();
    check_mounted(Arc::new(backend)).await;
}

#[tokio::test]
async fn conformance_filesystem_with_gitignore() {
    let tmp = TempDir::new().unwrap();
    let backend = FilesystemBackend::builder(tmp.path().join("root"))
        .respect_gitignore(true)
        .build()
        .unwrap();
    check_backend(Arc::new(backend)).await;
}

#[tokio::test]
async fn conformance_filesystem_without_symlinks() {
    let tmp = TempDir::new().unwrap();
    let backend = FilesystemBackend::builder(tmp.path().join("root"))
        .follow_symlinks(false)
        .build()
        .unwrap();
    assert!(!backend.follows_symlinks());
    check_backend(Arc::new(backend)).await;
}

#[tokio::test]
async fn symlinks_can_be_refused_entirely() {
    let tmp = TempDir::new().unwrap();
    let b = FilesystemBackend::builder(tmp.path().join("root"))
        .follow_symlinks(false)
        .build()
        .unwrap();
    put(b.root(), "real/file.txt", "real\n");
    symlink("real", b.root().join("alias")).unwrap();
    symlink("real/file.txt", b.root().join("link.txt")).unwrap();
    for path in ["/alias/file.txt", "/link.txt"] {
        let error = b.read(&cx(), &p(path), 0, 10).await.unwrap_err();
        assert!(
            matches!(error, BackendError::PermissionDenied { .. }),
            "{error:?}"
        );
        assert!(b.write(&cx(), &p(path), "x").await.is_err());
    }
    assert_eq!(text(&b, "/real/file.txt").await, ["real"]);
    assert_eq!(glob(&b, "*.txt", "/").await, ["/real/file.txt"]);
    let (found, _) = grep(&b, GrepQuery::literal("real", p("/"))).await;
    assert_eq!(found, ["/real/file.txt:1:real"]);
    // Links can still be deleted (the link, not the target).
    assert_eq!(b.delete(&cx(), &p("/link.txt")).await.unwrap().value, 1);
    assert!(b.root().join("real/file.txt").exists());
}

#[tokio::test]
async fn write_creates_parents_on_disk() {
    let (_tmp, b) = setup();
    b.write(&cx(), &p("/a/b/c.txt"), "x\n").await.unwrap();
    assert_eq!(
        std::fs::read_to_string(b.root().join("a/b/c.txt")).unwrap(),
        "x\n"
    );
    // write only creates: the file is left as it was.
    assert!(matches!(
        b.write(&cx(), &p("/a/b/c.txt"), "").await,
        Err(BackendError::AlreadyExists { .. })
    ));
    assert_eq!(std::fs::read(b.root().join("a/b/c.txt")).unwrap(), b"x\n");
    // Overwrite truncates.
    b.overwrite(&cx(), &p("/a/b/c.txt"), "").await.unwrap();
    assert_eq!(std::fs::read(b.root().join("a/b/c.txt")).unwrap(), b"");
    assert!(matches!(
        b.write(&cx(), &p("/"), "x").await,
        Err(BackendError::IsDirectory { .. })
    ));
}

#[tokio::test]
async fn ls_reports_sizes_dirs_and_times() {
    let (_tmp, b) = setup();
    put(b.root(), "z.txt", "12345");
    put(b.root(), "a/inner.txt", "");
    put(b.root(), ".dot", "x");
    let entries = b.ls(&cx(), &p("/")).await.unwrap();
    let paths: Vec<_> = entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["/.dot", "/a", "/z.txt"]);
    assert!(entries[1].is_dir);
    assert_eq!(entries[1].size, 0);
    assert_eq!(entries[2].size, 5);
    assert!(
        entries
            .iter()
            .all(|e| e.modified_at_ms.is_some_and(|t| t > 1_600_000_000_000))
    );
    let inner = b.ls(&cx(), &p("/a")).await.unwrap();
    assert_eq!(inner[0].path, "/a/inner.txt");
}

#[tokio::test]
async fn crlf_long_lines_and_paging() {
    let (_tmp, b) = setup();
    put(b.root(), "crlf.txt", "one\r\ntwo\r\nthree");
    assert_eq!(text(&b, "/crlf.txt").await, ["one", "two", "three"]);
    let long = "x".repeat(200_000);
    put(b.root(), "long.txt", format!("{long}\nshort\n"));
    let lines = text(&b, "/long.txt").await;
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0].len(), 200_000);
    let page = b.read(&cx(), &p("/long.txt"), 1, 1).await.unwrap();
    assert_eq!(
        page,
        ReadResult::Text {
            lines: vec!["short".into()],
            offset: 1,
            total_lines: 2
        }
    );
    // grep finds the short line and returns long lines whole.
    let (found, _) = grep(&b, GrepQuery::literal("short", p("/"))).await;
    assert_eq!(found, ["/long.txt:2:short"]);
    let (found, _) = grep(&b, GrepQuery::literal("two", p("/"))).await;
    assert_eq!(found, ["/crlf.txt:2:two"]);
    let (found, _) = grep(
        &b,
        GrepQuery {
            regex: true,
            ..GrepQuery::literal("^two$", p("/"))
        },
    )
    .await;
    assert_eq!(found, ["/crlf.txt:2:two"], "$ matches before \\r\\n");
}

#[tokio::test]
async fn binary_and_multimodal_files() {
    let (_tmp, b) = setup();
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    let pdf = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n".to_vec();
    let jpeg = b"\xff\xd8\xff\xe0\0\x10JFIF".to_vec();
    put(b.root(), "img/a.png", &png);
    put(b.root(), "doc/b.pdf", &pdf);
    put(b.root(), "img/noext", &jpeg);
    put(
        b.root(),
        "img/c.svg",
        "<svg xmlns=\"http://www.w3.org/2000/svg\"/>",
    );
    put(b.root(), "bad.txt", b"caf\xe9 needle\n");
    put(b.root(), "nul.txt", b"needle\0\n");
    for (path, mime, data) in [
        ("/img/a.png", "image/png", &png),
        ("/doc/b.pdf", "application/pdf", &pdf),
        ("/img/noext", "image/jpeg", &jpeg),
    ] {
        match b.read(&cx(), &p(path), 0, 10).await.unwrap() {
            ReadResult::Binary {
                mime_type,
                data: got,
            } => {
                assert_eq!(mime_type, mime, "{path}");
                assert_eq!(&got, data);
            }
            other => panic!("{path}: {other:?}"),
        }
        let raw = b.read_raw(&cx(), &p(path)).await.unwrap();
        assert_eq!(raw.mime_type, mime);
    }
    assert!(matches!(
        b.read(&cx(), &p("/img/c.svg"), 0, 10).await.unwrap(),
        ReadResult::Binary { mime_type, .. } if mime_type == "image/svg+xml"
    ));
    // Invalid UTF-8 is text (U+FFFD for the bad byte); a NUL makes a file binary, and binary
    // files are skipped by grep, which names them.
    assert_eq!(text(&b, "/bad.txt").await, ["caf\u{FFFD} needle"]);
    assert!(matches!(
        b.read(&cx(), &p("/nul.txt"), 0, 10).await.unwrap(),
        ReadResult::Binary { mime_type, .. } if mime_type == "application/octet-stream"
    ));
    assert_eq!(
        grep(&b, GrepQuery::literal("needle", p("/"))).await.0,
        ["/bad.txt:1:caf\u{FFFD} needle"]
    );
    assert!(
        grep(&b, GrepQuery::literal("svg", p("/")))
            .await
            .0
            .is_empty()
    );
    let skipped: Vec<String> = b
        .grep(&cx(), &GrepQuery::literal("svg", p("/")))
        .await
        .unwrap()
        .skipped
        .into_iter()
        .map(|s| s.path)
        .collect();
    assert_eq!(
        skipped,
        [
            "/doc/b.pdf",
            "/img/a.png",
            "/img/c.svg",
            "/img/noext",
            "/nul.txt"
        ]
    );
    assert!(matches!(
        b.edit(&cx(), &p("/nul.txt"), "needle", "x", false).await,
        Err(BackendError::Binary { .. })
    ));
    b.edit(&cx(), &p("/bad.txt"), "needle", "pin", false)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(b.root().join("bad.txt")).unwrap(),
        b"caf\xe9 pin\n"
    );
}

#[tokio::test]
async fn max_file_size_is_enforced() {
    let tmp = TempDir::new().unwrap();
    let b = FilesystemBackend::builder(tmp.path().join("root"))
        .max_file_size(10)
        .build()
        .unwrap();
    put(b.root(), "small.txt", "0123456789");
    put(b.root(), "big.txt", "01234\n56789A\n");
    put(b.root(), "big.bin", b"0123456789\0\n");
    assert_eq!(text(&b, "/small.txt").await, ["0123456789"]);
    // A text file over the limit is still paged (a page holds at most the limit); a binary one
    // cannot be returned whole.
    assert_eq!(text(&b, "/big.txt").await, ["01234"]);
    assert_eq!(text_page(&b, "/big.txt", 1, 10).await, ["56789A"]);
    let error = b.read(&cx(), &p("/big.bin"), 0, 10).await.unwrap_err();
    assert!(
        matches!(
            error,
            BackendError::TooLarge {
                size: 12,
                max: 10,
                ..
            }
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("grep") && message.contains("offset"),
        "the message says what to do: {message}"
    );
    assert!(
        !message.contains("shell") && !message.contains("execute"),
        "no tool the backend lacks is suggested: {message}"
    );
    assert!(matches!(
        b.read_raw(&cx(), &p("/big.txt")).await,
        Err(BackendError::TooLarge { .. })
    ));
    assert!(matches!(
        b.edit(&cx(), &p("/big.txt"), "0", "1", false).await,
        Err(BackendError::TooLarge { .. })
    ));
    // grep still searches big files (that is how the model reads them).
    let (found, _) = grep(&b, GrepQuery::literal("A", p("/"))).await;
    assert_eq!(found, ["/big.txt:2:56789A"]);
    let downloads = b.download_files(&cx(), vec!["/big.txt".into()]).await;
    assert_eq!(downloads, [Err(FileOpError::PermissionDenied)]);
}

#[tokio::test]
async fn writes_edits_and_uploads_respect_the_size_limit() {
    let tmp = TempDir::new().unwrap();
    let b = FilesystemBackend::builder(tmp.path().join("root"))
        .max_file_size(10)
        .build()
        .unwrap();
    b.write(&cx(), &p("/exact.txt"), "0123456789")
        .await
        .unwrap();
    assert_eq!(text(&b, "/exact.txt").await, ["0123456789"]);
    let error = b
        .write(&cx(), &p("/new/big.txt"), "0123456789A")
        .await
        .unwrap_err();
    assert_eq!(
        error,
        BackendError::TooLargeToWrite {
            path: "/new/big.txt".into(),
            size: 11,
            max: 10
        }
    );
    let message = error.to_string();
    assert!(
        message.contains("10-byte") && message.contains("11 bytes"),
        "{message}"
    );
    assert!(
        !b.root().join("new").exists(),
        "a refused write creates nothing, not even its parents"
    );
    // Overwriting with too much leaves the old content.
    assert!(matches!(
        b.write(&cx(), &p("/exact.txt"), "0123456789AB").await,
        Err(BackendError::TooLargeToWrite { size: 12, .. })
    ));
    assert_eq!(
        std::fs::read_to_string(b.root().join("exact.txt")).unwrap(),
        "0123456789"
    );
    // An edit that would grow the file past the limit changes nothing.
    let error = b
        .edit(&cx(), &p("/exact.txt"), "9", "9ABC", false)
        .await
        .unwrap_err();
    assert_eq!(
        error,
        BackendError::TooLargeToWrite {
            path: "/exact.txt".into(),
            size: 13,
            max: 10
        }
    );
    assert_eq!(
        std::fs::read_to_string(b.root().join("exact.txt")).unwrap(),
        "0123456789"
    );
    assert_eq!(
        b.edit(&cx(), &p("/exact.txt"), "0123", "x", false)
            .await
            .unwrap()
            .value,
        1
    );
    let answers = b
        .upload_files(
            &cx(),
            vec![
                ("/up/big.bin".into(), vec![7; 11]),
                ("/up/ok.bin".into(), vec![7; 10]),
            ],
        )
        .await
        .value;
    assert_eq!(answers, [Err(FileOpError::PermissionDenied), Ok(())]);
    assert!(!b.root().join("up/big.bin").exists());
    assert_eq!(std::fs::read(b.root().join("up/ok.bin")).unwrap(), [7; 10]);
}

#[tokio::test]
async fn the_default_size_limit_is_ten_mebibytes() {
    let (_tmp, b) = setup();
    assert_eq!(deepagents_backends::DEFAULT_MAX_FILE_SIZE, 10 * 1024 * 1024);
    let limit = usize::try_from(deepagents_backends::DEFAULT_MAX_FILE_SIZE).unwrap();
    let fits = "x".repeat(limit);
    b.write(&cx(), &p("/fits.txt"), &fits).await.unwrap();
    let over = b
        .write(&cx(), &p("/over.txt"), &format!("{fits}x"))
        .await
        .unwrap_err();
    assert!(
        matches!(over, BackendError::TooLargeToWrite { max, .. } if max == deepagents_backends::DEFAULT_MAX_FILE_SIZE),
        "{over:?}"
    );
    let uploaded = b
        .upload_files(&cx(), vec![("/over.bin".into(), vec![0; limit + 1])])
        .await
        .value;
    assert_eq!(uploaded, [Err(FileOpError::PermissionDenied)]);
}

#[tokio::test]
async fn edit_and_delete_on_disk() {
    let (_tmp, b) = setup();
    put(b.root(), "e.txt", "alpha beta\nbeta\n");
    assert_eq!(
        b.edit(&cx(), &p("/e.txt"), "beta", "B", true)
            .await
            .unwrap()
            .value,
        2
    );
    assert_eq!(
        std::fs::read_to_string(b.root().join("e.txt")).unwrap(),
        "alpha B\nB\n"
    );
    // A shorter result leaves no stale tail.
    assert_eq!(
        b.edit(&cx(), &p("/e.txt"), "alpha B\nB\n", "z", false)
            .await
            .unwrap()
            .value,
        1
    );
    assert_eq!(
        std::fs::read_to_string(b.root().join("e.txt")).unwrap(),
        "z"
    );
    put(b.root(), "tree/a.txt", "a");
    put(b.root(), "tree/sub/b.txt", "b");
    put(b.root(), "tree/sub/deeper/c.txt", "c");
    std::fs::create_dir_all(b.root().join("tree/empty")).unwrap();
    assert_eq!(b.delete(&cx(), &p("/tree")).await.unwrap().value, 3);
    assert!(!b.root().join("tree").exists());
    assert!(b.root().exists());
    assert!(matches!(
        b.delete(&cx(), &p("/")).await,
        Err(BackendError::PermissionDenied { .. })
    ));
}

#[tokio::test]
async fn upload_and_download_in_order() {
    let (_tmp, b) = setup();
    let answers = b
        .upload_files(
            &cx(),
            vec![
                ("/up/one.bin".into(), vec![0, 1, 2]),
                ("no-slash".into(), vec![1]),
                ("/up".into(), vec![1]),
                ("/up/two.txt".into(), b"two".to_vec()),
            ],
        )
        .await
        .value;
    assert_eq!(
        answers,
        [
            Ok(()),
            Err(FileOpError::InvalidPath),
            Err(FileOpError::IsDirectory),
            Ok(())
        ]
    );
    let downloads = b
        .download_files(
            &cx(),
            vec![
                "/up/two.txt".into(),
                "/up/x".into(),
                "/up/one.bin".into(),
                "/up".into(),
            ],
        )
        .await;
    assert_eq!(
        downloads,
        [
            Ok(b"two".to_vec()),
            Err(FileOpError::FileNotFound),
            Ok(vec![0, 1, 2]),
            Err(FileOpError::IsDirectory)
        ]
    );
}

/// A tree exercising glob semantics.
fn tree(root: &Path) {
    for rel in [
        "a.py",
        "src/main.rs",
        "src/lib.rs",
        "src/bin/tool.rs",
        "src/deep/er/x.py",
        "docs/guide.md",
        "docs/api.MD",
        ".env",
        ".github/workflows/ci.yml",
        "src/.cache/c.rs",
        "node_modules/pkg/index.js",
        "build/out.js",
    ] {
        put(root, rel, format!("content of {rel}\nneedle {rel}\n"));
    }
}

#[tokio::test]
async fn glob_semantics_on_a_real_tree() {
    let (_tmp, b) = setup();
    tree(b.root());
    assert_eq!(glob(&b, "*.py", "/").await, ["/a.py", "/src/deep/er/x.py"]);
    assert_eq!(
        glob(&b, "src/*.rs", "/").await,
        ["/src/lib.rs", "/src/main.rs"]
    );
    assert_eq!(
        glob(&b, "/src/*.rs", "/").await,
        ["/src/lib.rs", "/src/main.rs"]
    );
    assert_eq!(
        glob(&b, "src/**/*.rs", "/").await,
        ["/src/bin/tool.rs", "/src/lib.rs", "/src/main.rs"]
    );
    assert_eq!(glob(&b, "*.rs", "/src/bin").await, ["/src/bin/tool.rs"]);
    assert_eq!(glob(&b, "bin/*.rs", "/src").await, ["/src/bin/tool.rs"]);
    assert_eq!(
        glob(&b, "*.{md,MD}", "/").await,
        ["/docs/api.MD", "/docs/guide.md"]
    );
    assert_eq!(
        glob(&b, "*.[mM][dD]", "/docs").await,
        ["/docs/api.MD", "/docs/guide.md"]
    );
    // Dotfiles only when named.
    assert_eq!(glob(&b, ".env", "/").await, ["/.env"]);
    assert_eq!(glob(&b, "**/.env", "/").await, ["/.env"]);
    assert_eq!(
        glob(&b, ".github/**/*.yml", "/").await,
        ["/.github/workflows/ci.yml"]
    );
    assert!(glob(&b, "*.yml", "/").await.is_empty());
    assert_eq!(glob(&b, ".cache/*.rs", "/src").await, ["/src/.cache/c.rs"]);
    // Files only.
    assert!(glob(&b, "src", "/").await.is_empty());
    assert!(glob(&b, "bin", "/src").await.is_empty());
    // Base missing, base is a file, bad pattern.
    assert!(matches!(
        b.glob(&cx(), "*", &p("/missing")).await,
        Err(BackendError::NotFound { .. })
    ));
    assert!(glob(&b, "*", "/a.py").await.is_empty());
    assert!(matches!(
        b.glob(&cx(), "a[", &p("/")).await,
        Err(BackendError::InvalidQuery { what: "glob", .. })
    ));
    let infos = b.glob(&cx(), "a.py", &p("/")).await.unwrap().files;
    assert_eq!(infos[0].size, "content of a.py\nneedle a.py\n".len() as u64);
    assert!(!infos[0].is_dir);
}

#[tokio::test]
async fn grep_literal_regex_include_and_caps() {
    let (_tmp, b) = setup();
    tree(b.root());
    put(b.root(), "meta.txt", "a.b\naxb\nA.B\n");
    let q = |pattern: &str| GrepQuery::literal(pattern, p("/"));
    let (found, truncated) = grep(&b, q("a.b")).await;
    assert_eq!(found, ["/meta.txt:1:a.b"], "literal by default");
    assert!(!truncated);
    let (found, _) = grep(
        &b,
        GrepQuery {
            regex: true,
            ..q("a.b")
        },
    )
    .await;
    assert_eq!(found, ["/meta.txt:1:a.b", "/meta.txt:2:axb"]);
    let (found, _) = grep(
        &b,
        GrepQuery {
            case_insensitive: true,
            ..q("a.b")
        },
    )
    .await;
    assert_eq!(found, ["/meta.txt:1:a.b", "/meta.txt:3:A.B"]);
    // Hidden files are searched (like the other backends); .git never is.
    put(b.root(), ".git/config", "needle in git\n");
    let (all, _) = grep(&b, q("needle")).await;
    assert_eq!(all.len(), 12, "{all:?}");
    assert!(all.iter().any(|m| m.starts_with("/.env:")));
    assert!(!all.iter().any(|m| m.starts_with("/.git/")));
    let mut sorted = all.clone();
    sorted.sort();
    assert_eq!(all, sorted, "path then line order");
    // Include filter uses glob semantics relative to the search path.
    let (found, _) = grep(
        &b,
        GrepQuery {
            include: Some("*.rs".into()),
            ..q("needle")
        },
    )
    .await;
    assert_eq!(
        found,
        [
            "/src/bin/tool.rs:2:needle src/bin/tool.rs",
            "/src/lib.rs:2:needle src/lib.rs",
            "/src/main.rs:2:needle src/main.rs"
        ]
    );
    let (found, _) = grep(
        &b,
        GrepQuery {
            include: Some("bin/*.rs".into()),
            path: p("/src"),
            ..q("needle")
        },
    )
    .await;
    assert_eq!(found, ["/src/bin/tool.rs:2:needle src/bin/tool.rs"]);
    // A single file as the search path.
    let (found, _) = grep(
        &b,
        GrepQuery {
            path: p("/a.py"),
            ..q("needle")
        },
    )
    .await;
    assert_eq!(found, ["/a.py:2:needle a.py"]);
    // Max count: the first N in path order, deterministic across runs, marked truncated.
    for _ in 0..5 {
        let (found, truncated) = grep(
            &b,
            GrepQuery {
                max_count: 3,
                ..q("needle")
            },
        )
        .await;
        assert_eq!(found, all[..3]);
        assert!(truncated);
    }
    let (found, truncated) = grep(
        &b,
        GrepQuery {
            max_count: all.len(),
            ..q("needle")
        },
    )
    .await;
    assert_eq!(found.len(), all.len());
    assert!(!truncated, "exactly max_count matches is not truncated");
    assert!(matches!(
        b.grep(&cx(), &GrepQuery::literal("x", p("/missing"))).await,
        Err(BackendError::NotFound { .. })
    ));
    // A literal with a line break cannot match a line.
    assert!(grep(&b, q("needle\nneedle")).await.0.is_empty());
}

#[tokio::test]
async fn many_matches_in_one_file_are_capped() {
    let (_tmp, b) = setup();
    put(b.root(), "many.txt", "hit\n".repeat(5_000));
    let (found, truncated) = grep(&b, GrepQuery::literal("hit", p("/"))).await;
    assert_eq!(found.len(), 1_000);
    assert_eq!(found[999], "/many.txt:1000:hit");
    assert!(truncated);
}

#[tokio::test]
async fn gitignore_is_opt_in() {
    let tmp = TempDir::new().unwrap();
    let root = tmp.path().join("root");
    tree(&root);
    put(&root, ".gitignore", "node_modules/\n*.js\n");
    put(&root, "src/.gitignore", "bin/\n");
    // An ignore file above the root must never matter.
    put(tmp.path(), ".gitignore", "*.py\n");
    let plain = FilesystemBackend::new(&root).unwrap();
    assert_eq!(
        glob(&plain, "*.js", "/").await,
        ["/build/out.js", "/node_modules/pkg/index.js"]
    );
    let ignoring = FilesystemBackend::builder(&root)
        .respect_gitignore(true)
        .build()
        .unwrap();
    assert!(glob(&ignoring, "*.js", "/").await.is_empty());
    assert_eq!(
        glob(&ignoring, "*.rs", "/src").await,
        ["/src/lib.rs", "/src/main.rs"]
    );
    assert_eq!(
        glob(&ignoring, "*.py", "/").await,
        ["/a.py", "/src/deep/er/x.py"]
    );
    let (found, _) = grep(&ignoring, GrepQuery::literal("needle", p("/"))).await;
    assert!(
        !found
            .iter()
            .any(|m| m.contains(".js") || m.contains("/bin/")),
        "{found:?}"
    );
    let (found, _) = grep(&plain, GrepQuery::literal("needle", p("/"))).await;
    assert!(found.iter().any(|m| m.contains("index.js")), "{found:?}");
    // ls always shows everything.
    let listed = ignoring.ls(&cx(), &p("/")).await.unwrap();
    assert!(listed.iter().any(|e| e.path == "/node_modules"));
}

/// Ignore files are read through the walk's descriptors: `.git/info/exclude` counts, a deeper
/// file's negation wins over a shallower pattern, `.gitignore` beats exclude, and a symlinked
/// ignore file (which could point anywhere) is not read.
#[tokio::test]
async fn ignore_files_deeper_first_and_exclude_files() {
    let tmp = TempDir::new().unwrap();
    let root = tmp.path().join("root");
    put(&root, "keep.txt", "needle\n");
    put(&root, "drop.log", "needle\n");
    put(&root, "tmp/x.txt", "needle\n");
    put(&root, "lib/a.log", "needle\n");
    put(&root, "lib/b.log", "needle\n");
    put(&root, "lib/excluded.txt", "needle\n");
    put(&root, "linked/y.txt", "needle\n");
    put(&root, ".gitignore", "*.log\n");
    put(
        &root,
        ".git/info/exclude",
        "tmp/\nexcluded.txt\n!drop.log\n",
    );
    put(&root, "lib/.gitignore", "!a.log\n");
    put(tmp.path(), "elsewhere", "y.txt\n");
    symlink(tmp.path().join("elsewhere"), root.join("linked/.gitignore")).unwrap();
    let b = FilesystemBackend::builder(&root)
        .respect_gitignore(true)
        .build()
        .unwrap();
    assert_eq!(
        glob(&b, "*.{txt,log}", "/").await,
        ["/keep.txt", "/lib/a.log", "/linked/y.txt"]
    );
    let (found, _) = grep(&b, GrepQuery::literal("needle", p("/lib"))).await;
    // From /lib, the root's ignore files are above the search: only lib's own applies.
    assert_eq!(
        found,
        [
            "/lib/a.log:1:needle",
            "/lib/b.log:1:needle",
            "/lib/excluded.txt:1:needle"
        ]
    );
}

#[tokio::test]
async fn in_root_symlinks_are_followed() {
    let (_tmp, b) = setup();
    put(b.root(), "real/file.txt", "real\n");
    symlink("real", b.root().join("alias")).unwrap();
    symlink("real/file.txt", b.root().join("link.txt")).unwrap();
    symlink("real/../real/file.txt", b.root().join("up.txt")).unwrap();
    if !b.follows_symlinks() {
        return; // hosts without openat2 refuse every symlink; escape.rs covers that.
    }
    assert_eq!(text(&b, "/alias/file.txt").await, ["real"]);
    assert_eq!(text(&b, "/link.txt").await, ["real"]);
    b.write(&cx(), &p("/alias/new.txt"), "via alias")
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(b.root().join("real/new.txt")).unwrap(),
        "via alias"
    );
    let listed = b.ls(&cx(), &p("/")).await.unwrap();
    let alias = listed.iter().find(|e| e.path == "/alias").unwrap();
    assert!(alias.is_dir, "a link is listed as what it points to");
    // Walks report symlinked files but do not descend symlinked directories.
    assert_eq!(
        glob(&b, "*.txt", "/").await,
        ["/link.txt", "/real/file.txt", "/real/new.txt", "/up.txt"]
    );
    // Deleting a link removes the link only.
    assert_eq!(b.delete(&cx(), &p("/alias")).await.unwrap().value, 1);
    assert!(b.root().join("real/file.txt").exists());
}

/// `ls` marks a symlink it will not follow, and says why, rather than passing it off as an
/// empty file; one that stays inside the root is listed as what it points to.
#[tokio::test]
async fn ls_marks_symlinks_that_cannot_be_followed() {
    let (tmp, b) = setup();
    put(b.root(), "real/file.txt", "twelve bytes");
    put(tmp.path(), "outside.txt", "outside content");
    symlink("real/file.txt", b.root().join("inside.txt")).unwrap();
    symlink("real", b.root().join("alias")).unwrap();
    symlink("../outside.txt", b.root().join("climbs_out")).unwrap();
    symlink(tmp.path().join("outside.txt"), b.root().join("absolute")).unwrap();
    symlink("/etc", b.root().join("etc")).unwrap();
    symlink("real/missing.txt", b.root().join("dangling")).unwrap();
    symlink("loop", b.root().join("loop")).unwrap();
    let listed = b.ls(&cx(), &p("/")).await.unwrap();
    let entry = |name: &str| {
        listed
            .iter()
            .find(|e| e.path == format!("/{name}"))
            .unwrap_or_else(|| panic!("{name} not listed: {listed:?}"))
    };
    for name in ["climbs_out", "absolute", "etc"] {
        let link = entry(name);
        assert_eq!(
            link.broken_link,
            Some(BrokenLink::OutsideRoot),
            "{name}: {link:?}"
        );
        assert!(!link.is_dir && link.size == 0, "{name}: {link:?}");
    }
    for name in ["dangling", "loop"] {
        assert_eq!(
            entry(name).broken_link,
            Some(BrokenLink::Unresolvable),
            "{name}"
        );
    }
    let (inside, alias) = (entry("inside.txt"), entry("alias"));
    if b.follows_symlinks() {
        assert_eq!((inside.broken_link, inside.size), (None, 12), "{inside:?}");
        assert!(alias.is_dir && alias.broken_link.is_none(), "{alias:?}");
    } else {
        // Hosts without openat2 follow no symlink at all.
        assert_eq!(inside.broken_link, Some(BrokenLink::Unresolvable));
    }
    // Plain entries carry no mark, and none shows in their JSON.
    let real = entry("real");
    assert!(real.is_dir && real.broken_link.is_none());
    let json = serde_json::to_value(entry("climbs_out")).unwrap();
    assert_eq!(json["broken_link"], "outside_root", "{json}");
    assert!(
        serde_json::to_value(real)
            .unwrap()
            .get("broken_link")
            .is_none()
    );
}

/// A spent budget still returns what the walk had in hand: with a zero budget every walk
/// thread finishes the entry it holds, and a file being searched stops after the match that
/// found the budget spent. So the result is non-empty, marked truncated, and a strict subset of
/// the full answer — deterministically, whatever the machine's speed.
#[tokio::test]
async fn search_time_budget_returns_partial_results() {
    let tmp = TempDir::new().unwrap();
    let root = tmp.path().join("root");
    // A flat tree: every entry below the base is a file that matches, so whichever entry a
    // walk thread holds when the budget is found spent contributes.
    for i in 0..200 {
        put(
            &root,
            &format!("f{i:03}.txt"),
            format!("needle {i} first\nneedle {i} second\nneedle {i} third\n"),
        );
    }
    let full = FilesystemBackend::new(&root).unwrap();
    let all_files = glob(&full, "*.txt", "/").await;
    assert_eq!(all_files.len(), 200);
    let query = GrepQuery {
        max_count: usize::MAX,
        ..GrepQuery::literal("needle", p("/"))
    };
    let (all_matches, truncated) = grep(&full, query.clone()).await;
    assert_eq!(all_matches.len(), 600);
    assert!(!truncated);
    let spent = FilesystemBackend::builder(&root)
        .search_timeout(Duration::ZERO)
        .build()
        .unwrap();
    for _ in 0..5 {
        let globbed = spent.glob(&cx(), "*.txt", &p("/")).await.unwrap();
        assert!(globbed.truncated);
        assert!(
            !globbed.files.is_empty(),
            "a spent budget still returns results"
        );
        assert!(
            globbed.files.len() < all_files.len(),
            "{}",
            globbed.files.len()
        );
        for file in &globbed.files {
            assert!(all_files.contains(&file.path), "{file:?}");
        }
        let (found, truncated) = grep(&spent, query.clone()).await;
        assert!(truncated);
        assert!(!found.is_empty(), "a spent budget still returns results");
        for line in &found {
            assert!(all_matches.contains(line), "{line}");
            // The budget was spent at the first match of each file searched.
            assert!(line.ends_with(" first"), "{line}");
        }
        let mut sorted = found.clone();
        sorted.sort();
        assert_eq!(found, sorted, "partial results keep path then line order");
    }
    // Searching a single file checks the budget only after its first match as well.
    let (found, truncated) = grep(
        &spent,
        GrepQuery {
            path: p("/f007.txt"),
            ..query
        },
    )
    .await;
    assert_eq!(found, ["/f007.txt:1:needle 7 first"]);
    assert!(truncated);
}

#[tokio::test]
async fn non_virtual_mode_uses_host_paths() {
    let tmp = TempDir::new().unwrap();
    let host = tmp.path().join("elsewhere/file.txt");
    put(tmp.path(), "elsewhere/file.txt", "host\n");
    let b = FilesystemBackend::builder(tmp.path().join("root"))
        .virtual_mode(false)
        .build()
        .unwrap();
    assert!(!b.is_virtual());
    let vpath = p(host.to_str().unwrap());
    match b.read(&cx(), &vpath, 0, 10).await.unwrap() {
        ReadResult::Text { lines, .. } => assert_eq!(lines, ["host"]),
        other => panic!("{other:?}"),
    }
    let base = p(tmp.path().join("elsewhere").to_str().unwrap());
    let found = glob(&b, "*.txt", base.as_str()).await;
    assert_eq!(found, [vpath.to_string()]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn write_then_read_round_trips(content in "(?s).{0,300}", name in "[a-zA-Z0-9_.-]{1,20}") {
        prop_assume!(name != "." && name != "..");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (_tmp, b) = setup();
            let path = p(&format!("/dir/{name}"));
            b.write(&cx(), &path, &content).await.unwrap();
            let raw = b.read_raw(&cx(), &path).await.unwrap();
            prop_assert_eq!(&raw.data, content.as_bytes());
            let read = b.read(&cx(), &path, 0, usize::MAX).await.unwrap();
            if let ReadResult::Text { lines, .. } = read {
                let expected: Vec<String> =
                    deepagents_backends::text::lines(&content).map(str::to_owned).collect();
                prop_assert_eq!(lines, expected);
            }
            Ok(())
        })?;
    }

    #[test]
    fn upload_then_download_round_trips_bytes(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (_tmp, b) = setup();
            let answers = b.upload_files(&cx(), vec![("/f.bin".into(), data.clone())]).await.value;
            prop_assert_eq!(answers, vec![Ok(())]);
            let downloads = b.download_files(&cx(), vec!["/f.bin".into()]).await;
            prop_assert_eq!(downloads, vec![Ok(data.clone())]);
            Ok(())
        })?;
    }

    /// Every backend edits like the model: same count, same errors, same resulting file, and
    /// a failed edit leaves the file as it was.
    #[test]
    fn edit_agrees_with_a_reference_model_on_every_backend(
        (text, old) in text_and_needle(),
        new in "[abcé]{0,3}",
        all in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let expected = model_edit(&text, &old, &new, all);
            let (_tmp, disk) = setup();
            let backends: [Arc<dyn Backend>; 3] = [
                Arc::new(StateBackend::default()),
                Arc::new(StoreBackend::new(Arc::new(InMemoryStore::new()))),
                Arc::new(disk),
            ];
            for backend in backends {
                let name = backend.name();
                let mut h = Harness::new(backend);
                h.write("/e.txt", &text).await;
                let got = h.edit("/e.txt", &old, &new, all).await;
                let after = String::from_utf8(h.read_raw("/e.txt").await.unwrap().data).unwrap();
                match &expected {
                    Ok((updated, count)) => {
                        prop_assert_eq!(got, Ok(*count), "{}", name);
                        prop_assert_eq!(&after, updated, "{}", name);
                    }
                    Err(Refusal::NotFound) => {
                        prop_assert_eq!(
                            got,
                            Err(BackendError::StringNotFound { path: "/e.txt".into() }),
                            "{}", name
                        );
                        prop_assert_eq!(&after, &text, "{}", name);
                    }
                    Err(Refusal::NotUnique(count)) => {
                        prop_assert_eq!(
                            got,
                            Err(BackendError::NotUnique { path: "/e.txt".into(), count: *count }),
                            "{}", name
                        );
                        prop_assert_eq!(&after, &text, "{}", name);
                    }
                }
            }
            Ok(())
        })?;
    }
}

#[test]
fn the_edit_model_matches_known_answers() {
    assert_eq!(
        model_edit("aaa", "aa", "b", false).unwrap(),
        ("ba".into(), 1)
    );
    assert_eq!(
        model_edit("aaaa", "aa", "b", true).unwrap(),
        ("bb".into(), 2)
    );
    assert!(matches!(
        model_edit("abab", "ab", "", false),
        Err(Refusal::NotUnique(2))
    ));
    assert!(matches!(
        model_edit("abc", "d", "", true),
        Err(Refusal::NotFound)
    ));
    assert_eq!(
        model_edit("éaé", "é", "e", true).unwrap(),
        ("eae".into(), 2)
    );
}

/// Why the model refuses an edit.
#[derive(Debug)]
enum Refusal {
    NotFound,
    NotUnique(usize),
}

/// Exact-string replacement written out by hand, independent of `text::replace`: occurrences
/// are found left to right and do not overlap (`aa` occurs once in `aaa`), as in the reference
/// implementation's `str.count` and `str.replace`.
fn model_edit(text: &str, old: &str, new: &str, all: bool) -> Result<(String, usize), Refusal> {
    let mut starts = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find(old) {
        starts.push(from + found);
        from += found + old.len();
    }
    match starts.len() {
        0 => return Err(Refusal::NotFound),
        n if n > 1 && !all => return Err(Refusal::NotUnique(n)),
        _ => {}
    }
    let mut updated = String::new();
    let mut copied = 0;
    for start in &starts {
        updated.push_str(&text[copied..*start]);
        updated.push_str(new);
        copied = start + old.len();
    }
    updated.push_str(&text[copied..]);
    Ok((updated, starts.len()))
}

/// A text and a needle that is, half of the time, cut from the text (so it occurs at least
/// once), else drawn independently (so it often does not occur).
fn text_and_needle() -> impl Strategy<Value = (String, String)> {
    (
        "[abé\n]{0,40}",
        "[abé]{1,3}",
        any::<proptest::sample::Index>(),
        1..4usize,
        any::<bool>(),
    )
        .prop_map(|(text, random, at, len, cut)| {
            let chars: Vec<char> = text.chars().collect();
            if !cut || chars.is_empty() {
                return (text, random);
            }
            let start = at.index(chars.len());
            let end = (start + len).min(chars.len());
            let needle: String = chars[start..end].iter().collect();
            (text, needle)
        })
}

#[tokio::test]
async fn names_a_virtual_path_cannot_hold_are_skipped() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let (_tmp, b) = setup();
    put(b.root(), "ok.txt", "needle\n");
    put(b.root(), "back\\slash.txt", "needle\n");
    put(b.root(), "new\nline.txt", "needle\n");
    std::fs::write(
        b.root().join(OsStr::from_bytes(b"latin\xe9.txt")),
        "needle\n",
    )
    .unwrap();
    let listed: Vec<String> = b
        .ls(&cx(), &p("/"))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(listed, ["/ok.txt"]);
    assert_eq!(glob(&b, "*.txt", "/").await, ["/ok.txt"]);
    let (found, _) = grep(&b, GrepQuery::literal("needle", p("/"))).await;
    assert_eq!(found, ["/ok.txt:1:needle"]);
}

#[tokio::test]
async fn fifos_are_refused_without_blocking() {
    let (_tmp, b) = setup();
    let status = std::process::Command::new("mkfifo")
        .arg(b.root().join("pipe"))
        .status()
        .unwrap();
    assert!(status.success());
    // Opening a FIFO for reading would block forever without O_NONBLOCK; each call must return.
    for result in [
        b.read(&cx(), &p("/pipe"), 0, 10).await.map(|_| ()),
        b.read_raw(&cx(), &p("/pipe")).await.map(|_| ()),
        b.write(&cx(), &p("/pipe"), "x").await.map(|_| ()),
        b.edit(&cx(), &p("/pipe"), "a", "b", false)
            .await
            .map(|_| ()),
    ] {
        assert!(
            matches!(
                result,
                Err(BackendError::PermissionDenied { .. }) | Err(BackendError::Io { .. })
            ),
            "{result:?}"
        );
    }
    assert!(glob(&b, "*", "/").await.is_empty());
    assert!(grep(&b, GrepQuery::literal("x", p("/"))).await.0.is_empty());
    let listed = b.ls(&cx(), &p("/")).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(!listed[0].is_dir);
}

#[tokio::test]
async fn path_mappings_name_the_host_directory() {
    let (_tmp, b) = setup();
    let mappings = b.path_mappings();
    assert_eq!(mappings.len(), 1);
    assert!(mappings[0].prefix.is_root());
    assert_eq!(mappings[0].host.as_deref(), Some(b.root()));
    let tmp = TempDir::new().unwrap();
    let host = FilesystemBackend::builder(tmp.path().join("r"))
        .virtual_mode(false)
        .build()
        .unwrap();
    assert_eq!(
        host.path_mappings()[0].host.as_deref(),
        Some(Path::new("/"))
    );
    let shell = deepagents_backends::LocalShellBackend::new(b.clone());
    assert_eq!(shell.path_mappings(), mappings);
}

/// The bytes of `café crème` in Latin-1, then an ASCII line.
const LATIN1: &[u8] = b"caf\xe9 cr\xe8me\nneedle here\n";

#[tokio::test]
async fn latin1_text_is_read_searched_and_edited_byte_wise() {
    let (_tmp, b) = setup();
    put(b.root(), "menu.txt", LATIN1);
    put(b.root(), "a.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR");
    put(b.root(), "b.bin", b"needle\0here\n");
    assert_eq!(
        text(&b, "/menu.txt").await,
        ["caf\u{FFFD} cr\u{FFFD}me", "needle here"]
    );
    let result = b
        .grep(&cx(), &GrepQuery::literal("needle", p("/")))
        .await
        .unwrap();
    let found: Vec<(&str, usize, &str)> = result
        .matches
        .iter()
        .map(|m| (m.path.as_str(), m.line_number, m.line.as_str()))
        .collect();
    assert_eq!(found, [("/menu.txt", 2, "needle here")]);
    let skipped: Vec<(&str, String)> = result
        .skipped
        .iter()
        .map(|s| (s.path.as_str(), s.reason.to_string()))
        .collect();
    assert_eq!(
        skipped,
        [
            ("/a.png", "binary, image/png".to_owned()),
            ("/b.bin", "binary, application/octet-stream".to_owned())
        ]
    );
    // Matching lines are shown with U+FFFD, as read shows them.
    let (found, _) = grep(&b, GrepQuery::literal("cr", p("/"))).await;
    assert_eq!(found, ["/menu.txt:1:caf\u{FFFD} cr\u{FFFD}me"]);
    let host = b.root().join("menu.txt");
    // Only the replaced span changes; the other invalid bytes stay as they are, also inside
    // the unchanged start of `old`.
    b.edit(&cx(), &p("/menu.txt"), "here", "there", false)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(&host).unwrap(),
        b"caf\xe9 cr\xe8me\nneedle there\n"
    );
    b.edit(
        &cx(),
        &p("/menu.txt"),
        "caf\u{FFFD} cr\u{FFFD}me",
        "caf\u{FFFD} cr\u{FFFD}me glac\u{E9}e",
        false,
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read(&host).unwrap(),
        b"caf\xe9 cr\xe8me glac\xc3\xa9e\nneedle there\n"
    );
    // Putting U+FFFD where invalid bytes are replaced cannot restore them: refused, unchanged.
    let before = std::fs::read(&host).unwrap();
    let refused = b
        .edit(&cx(), &p("/menu.txt"), "caf\u{FFFD}", "\u{FFFD}caf", false)
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, BackendError::NotUtf8 { path, .. } if path == "/menu.txt"),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("write_file"), "{refused}");
    assert_eq!(std::fs::read(&host).unwrap(), before);
    // Replacing the invalid byte with real text fixes it (the other one stays).
    b.edit(&cx(), &p("/menu.txt"), "caf\u{FFFD}", "caf\u{E9}", false)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(&host).unwrap(),
        b"caf\xc3\xa9 cr\xe8me glac\xc3\xa9e\nneedle there\n"
    );
}

/// A text file over the default 10 MiB limit is paged with offset and limit (it used to be
/// refused outright), and the page counts every line; a binary one is refused with advice that
/// names only tools the backend has.
#[tokio::test]
async fn files_over_the_limit_are_paged() {
    let (_tmp, b) = setup();
    let lines = 200_000;
    let mut big = String::with_capacity(12 * 1024 * 1024);
    for i in 0..lines {
        // 60 bytes a line: 12 MB in all.
        big.push_str(&format!("line {i:08} {}\n", "x".repeat(45)));
    }
    assert!(big.len() as u64 > deepagents_backends::DEFAULT_MAX_FILE_SIZE);
    put(b.root(), "big.log", &big);
    let page = b.read(&cx(), &p("/big.log"), 150_000, 3).await.unwrap();
    let x = "x".repeat(45);
    assert_eq!(
        page,
        ReadResult::Text {
            lines: vec![
                format!("line 00150000 {x}"),
                format!("line 00150001 {x}"),
                format!("line 00150002 {x}"),
            ],
            offset: 150_000,
            total_lines: lines,
        }
    );
    assert_eq!(page.next_offset(), Some(150_003));
    // Past the end: no lines, the total still counted.
    assert_eq!(
        b.read(&cx(), &p("/big.log"), lines + 5, 10).await.unwrap(),
        ReadResult::Text {
            lines: vec![],
            offset: lines + 5,
            total_lines: lines,
        }
    );
    // A NUL far into it makes it binary, which cannot be paged.
    let mut binary = big.into_bytes();
    let middle = binary.len() / 2;
    binary[middle] = 0;
    put(b.root(), "big.bin", &binary);
    let error = b.read(&cx(), &p("/big.bin"), 0, 3).await.unwrap_err();
    assert!(matches!(error, BackendError::TooLarge { .. }), "{error:?}");
    assert!(!error.to_string().contains("shell"), "{error}");
}

/// Paging keeps at most the size limit of one page; a first line over it alone is refused
/// rather than cut (the model would take the cut line for the whole).
#[tokio::test]
async fn a_page_holds_at_most_the_size_limit() {
    let tmp = TempDir::new().unwrap();
    let b = FilesystemBackend::builder(tmp.path().join("root"))
        .max_file_size(100)
        .build()
        .unwrap();
    let content = format!(
        "{}\n{}\nshort\r\n{}",
        "a".repeat(60),
        "b".repeat(60),
        "c".repeat(300)
    );
    put(b.root(), "wide.txt", &content);
    // Two 60-byte lines do not fit in 100 bytes: the page stops after the first.
    match b.read(&cx(), &p("/wide.txt"), 0, 10).await.unwrap() {
        ReadResult::Text {
            lines, total_lines, ..
        } => {
            assert_eq!(lines, ["a".repeat(60)]);
            assert_eq!(total_lines, 4);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(text_page(&b, "/wide.txt", 2, 1).await, ["short"]);
    let error = b.read(&cx(), &p("/wide.txt"), 3, 1).await.unwrap_err();
    assert!(
        matches!(
            error,
            BackendError::LineTooLong {
                line: 4,
                max: 100,
                ..
            }
        ),
        "{error:?}"
    );
}

async fn text_page(b: &FilesystemBackend, path: &str, offset: usize, limit: usize) -> Vec<String> {
    match b.read(&cx(), &p(path), offset, limit).await.unwrap() {
        ReadResult::Text { lines, .. } => lines,
        other => panic!("{path} is not text: {other:?}"),
    }
}

/// Files in `dir` whose names mark them as write temporaries.
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with('.') && name.ends_with(".tmp"))
        .collect()
}

/// Writers creating one file at once: `write` only creates, so exactly one of them succeeds,
/// its content whole, and every other is told the file exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creators_of_one_file_let_exactly_one_win() {
    for round in 0..10 {
        let (_tmp, b) = setup();
        let path = format!("/new-{round}.txt");
        let contents: Vec<String> = (b'A'..=b'H')
            .map(|c| String::from(char::from(c)).repeat(100_000))
            .collect();
        let writers: Vec<_> = contents
            .iter()
            .map(|content| {
                let (b, path, content) = (b.clone(), p(&path), content.clone());
                tokio::spawn(async move { b.write(&cx(), &path, &content).await.map(|_| ()) })
            })
            .collect();
        let mut won = 0;
        for writer in writers {
            match writer.await.unwrap() {
                Ok(()) => won += 1,
                Err(BackendError::AlreadyExists { path: named }) => assert_eq!(named, path),
                Err(other) => panic!("{other}"),
            }
        }
        assert_eq!(won, 1, "exactly one creator wins");
        let kept = std::fs::read_to_string(b.root().join(&path[1..])).unwrap();
        assert!(contents.contains(&kept), "{} bytes", kept.len());
        assert_eq!(temporaries(b.root()), Vec::<String>::new());
    }
}

/// Writers of different full contents to one file, with readers watching: every read sees
/// exactly one writer's content (or the first), never a mix, a prefix or an empty file. In
/// place, two writers left 100k `B` then 100k `A`, and readers saw truncated files.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_never_leave_a_torn_file() {
    let (_tmp, b) = setup();
    let size = 100_000;
    let contents: Vec<String> = (b'A'..=b'H')
        .map(|c| String::from(char::from(c)).repeat(size))
        .collect();
    let initial = "0".repeat(size);
    b.write(&cx(), &p("/shared.txt"), &initial).await.unwrap();
    let host = b.root().join("shared.txt");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (host, stop) = (host.clone(), Arc::clone(&stop));
            let mut allowed: Vec<Vec<u8>> =
                contents.iter().map(|c| c.clone().into_bytes()).collect();
            allowed.push(initial.clone().into_bytes());
            std::thread::spawn(move || {
                let mut reads = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let seen = std::fs::read(&host).unwrap();
                    assert!(
                        allowed.contains(&seen),
                        "a reader saw a torn file of {} bytes",
                        seen.len()
                    );
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let writers: Vec<_> = contents
        .iter()
        .map(|content| {
            let (b, content) = (b.clone(), content.clone());
            tokio::spawn(async move {
                for _ in 0..20 {
                    b.overwrite(&cx(), &p("/shared.txt"), &content)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for reader in readers {
        assert!(reader.join().unwrap() > 0);
    }
    let last = std::fs::read_to_string(&host).unwrap();
    assert!(contents.contains(&last), "{} bytes", last.len());
    assert_eq!(temporaries(b.root()), Vec::<String>::new());
}

/// Concurrent edits of one file apply one after the other: none is lost to another that read
/// the file before it was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_edits_all_apply() {
    let (_tmp, b) = setup();
    b.write(&cx(), &p("/log.txt"), "END\n").await.unwrap();
    let edits: Vec<_> = (0..16)
        .map(|i| {
            let b = b.clone();
            tokio::spawn(async move {
                b.edit(
                    &cx(),
                    &p("/log.txt"),
                    "END",
                    &format!("entry {i}\nEND"),
                    false,
                )
                .await
                .unwrap()
            })
        })
        .collect();
    for edit in edits {
        assert_eq!(edit.await.unwrap().value, 1);
    }
    let log = std::fs::read_to_string(b.root().join("log.txt")).unwrap();
    for i in 0..16 {
        assert!(
            log.contains(&format!("entry {i}\n")),
            "entry {i} lost:\n{log}"
        );
    }
    assert!(log.ends_with("END\n"));
}

#[tokio::test]
async fn writes_keep_permission_bits_and_leave_no_temporary_files() {
    use std::os::unix::fs::PermissionsExt;
    let (_tmp, b) = setup();
    put(b.root(), "run.sh", "#!/bin/sh\necho hi\n");
    put(b.root(), "secret.txt", "s\n");
    let mode = |name: &str| {
        std::fs::metadata(b.root().join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    std::fs::set_permissions(
        b.root().join("run.sh"),
        std::fs::Permissions::from_mode(0o751),
    )
    .unwrap();
    std::fs::set_permissions(
        b.root().join("secret.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    b.edit(&cx(), &p("/run.sh"), "hi", "bye", false)
        .await
        .unwrap();
    b.overwrite(&cx(), &p("/secret.txt"), "t\n").await.unwrap();
    assert_eq!(mode("secret.txt"), 0o600);
    b.upload_files(&cx(), vec![("/secret.txt".into(), b"u\n".to_vec())])
        .await;
    assert_eq!(mode("run.sh"), 0o751);
    assert_eq!(mode("secret.txt"), 0o600);
    assert_eq!(std::fs::read(b.root().join("secret.txt")).unwrap(), b"u\n");
    // A read-only file stays unwritable, as when it was written in place.
    std::fs::set_permissions(
        b.root().join("secret.txt"),
        std::fs::Permissions::from_mode(0o400),
    )
    .unwrap();
    if rustix::process::geteuid().is_root() {
        return; // root writes anything; the rest needs an ordinary user.
    }
    let refused = b
        .overwrite(&cx(), &p("/secret.txt"), "v\n")
        .await
        .unwrap_err();
    assert!(
        matches!(refused, BackendError::PermissionDenied { .. }),
        "{refused:?}"
    );
    assert_eq!(std::fs::read(b.root().join("secret.txt")).unwrap(), b"u\n");
    // In a directory that cannot take a temporary file, a writable file is still written (in
    // place, as the host allows).
    put(b.root(), "locked/notes.txt", "old\n");
    std::fs::set_permissions(
        b.root().join("locked"),
        std::fs::Permissions::from_mode(0o555),
    )
    .unwrap();
    b.edit(&cx(), &p("/locked/notes.txt"), "old", "new", false)
        .await
        .unwrap();
    b.overwrite(&cx(), &p("/locked/notes.txt"), "newest\n")
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(b.root().join("locked/notes.txt")).unwrap(),
        "newest\n"
    );
    assert!(b.write(&cx(), &p("/locked/other.txt"), "x").await.is_err());
    std::fs::set_permissions(
        b.root().join("locked"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    // A failed edit (text not found) creates nothing either.
    assert!(
        b.edit(&cx(), &p("/run.sh"), "absent", "x", false)
            .await
            .is_err()
    );
    assert_eq!(temporaries(b.root()), Vec::<String>::new());
}

/// Writing through an in-root symlink replaces its target and leaves the link a link.
#[tokio::test]
async fn writes_through_an_in_root_symlink_keep_the_link() {
    let (_tmp, b) = setup();
    put(b.root(), "real/file.txt", "old\n");
    symlink("real/file.txt", b.root().join("link.txt")).unwrap();
    symlink("link.txt", b.root().join("chain.txt")).unwrap();
    if !b.follows_symlinks() {
        return; // hosts without openat2 refuse every symlink; escape.rs covers that.
    }
    // The link's target exists, so a create-only write is refused and changes nothing.
    assert!(matches!(
        b.write(&cx(), &p("/chain.txt"), "new\n").await,
        Err(BackendError::AlreadyExists { .. })
    ));
    assert_eq!(
        std::fs::read_to_string(b.root().join("real/file.txt")).unwrap(),
        "old\n"
    );
    b.overwrite(&cx(), &p("/chain.txt"), "new\n").await.unwrap();
    b.edit(&cx(), &p("/link.txt"), "new", "newer", false)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(b.root().join("real/file.txt")).unwrap(),
        "newer\n"
    );
    for link in ["link.txt", "chain.txt"] {
        let meta = std::fs::symlink_metadata(b.root().join(link)).unwrap();
        assert!(meta.file_type().is_symlink(), "{link} is still a link");
    }
    assert_eq!(temporaries(&b.root().join("real")), Vec::<String>::new());
}
