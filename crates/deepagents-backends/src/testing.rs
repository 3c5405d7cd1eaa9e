//! The conformance suite: the cases every backend must pass, for your own backend too.
//!
//! Enable the `testing` feature (as a dev-dependency) and call it from a test
//! ([`check_core_backend`] for a backend that implements only the core methods):
//!
//! ```ignore
//! #[tokio::test]
//! async fn my_backend_conforms() {
//!     deepagents_backends::testing::check_backend(Arc::new(MyBackend::new())).await;
//!     deepagents_backends::testing::check_mounted(Arc::new(MyBackend::new())).await;
//! }
//! ```
//!
//! A failed case panics with what differed, like any assertion.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    reason = "a test suite: failing loudly is its job"
)]

use std::sync::Arc;

use crate::{
    Backend, BackendContext, BackendError, Changed, CompositeBackend, FileOpError, GrepQuery,
    GrepResult, RawFile, ReadResult, SkipReason, StateBackend, VPath,
};
use deepagents_core::StateSchema;

/// A backend with a context whose state absorbs every update, as a run would. Paths given to
/// the helpers are relative to `root`, and paths they return are shown relative to it again, so
/// one case can run at `/` and under a composite mount alike.
pub struct Harness {
    pub backend: Arc<dyn Backend>,
    pub cx: BackendContext,
    pub root: VPath,
}

pub fn p(path: &str) -> VPath {
    VPath::parse(path).unwrap()
}

/// The path an error names, for the variants that name one.
pub fn error_path(error: &BackendError) -> Option<&str> {
    match error {
        BackendError::NotFound { path }
        | BackendError::AlreadyExists { path }
        | BackendError::IsDirectory { path }
        | BackendError::NotADirectory { path }
        | BackendError::PermissionDenied { path, .. }
        | BackendError::TooLarge { path, .. }
        | BackendError::TooLargeToWrite { path, .. }
        | BackendError::Binary { path, .. }
        | BackendError::NotUtf8 { path, .. }
        | BackendError::LineTooLong { path, .. }
        | BackendError::StringNotFound { path }
        | BackendError::NotUnique { path, .. }
        | BackendError::Io { path, .. } => Some(path),
        _ => None,
    }
}

impl Harness {
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self::mounted(backend, "/")
    }

    /// A harness whose cases live under `root`.
    pub fn mounted(backend: Arc<dyn Backend>, root: &str) -> Self {
        Self {
            backend,
            cx: BackendContext::default(),
            root: p(root),
        }
    }

    /// The full path of a case path.
    pub fn at(&self, path: &str) -> VPath {
        p(path).under(&self.root)
    }

    /// A case path for a path the backend returned.
    fn shown(&self, full: &str) -> String {
        p(full)
            .strip_prefix(&self.root)
            .unwrap_or_else(|| panic!("{full} is outside the case root {}", self.root))
            .to_string()
    }

    /// A raw batch path: valid ones move under the root, invalid ones stay as they are.
    fn raw(&self, path: &str) -> String {
        VPath::parse(path).map_or_else(|_| path.to_owned(), |_| self.at(path).to_string())
    }

    /// Asserts that `error` names `path` (as a case path) in full.
    #[track_caller]
    pub fn assert_names(&self, error: &BackendError, path: &str) {
        assert_eq!(
            error_path(error),
            Some(self.at(path).as_str()),
            "the error names the path the agent used: {error}"
        );
    }

    fn absorb<T>(&mut self, changed: Changed<T>) -> T {
        let mut state = (*self.cx.state).clone();
        StateSchema::default()
            .apply_all(&mut state, [changed.update])
            .unwrap();
        self.cx.state = Arc::new(state);
        changed.value
    }

    pub async fn write(&mut self, path: &str, content: &str) {
        self.try_write(path, content).await.unwrap();
    }

    pub async fn try_write(&mut self, path: &str, content: &str) -> Result<(), BackendError> {
        let changed = self
            .backend
            .write(&self.cx, &self.at(path), content)
            .await?;
        self.absorb(changed);
        Ok(())
    }

    pub async fn overwrite(&mut self, path: &str, content: &str) {
        self.try_overwrite(path, content).await.unwrap();
    }

    pub async fn try_overwrite(&mut self, path: &str, content: &str) -> Result<(), BackendError> {
        let changed = self
            .backend
            .overwrite(&self.cx, &self.at(path), content)
            .await?;
        self.absorb(changed);
        Ok(())
    }

    /// The creation time the agent state records for a case path, when the backend keeps its
    /// files there (other backends do not report one).
    pub fn created_at_ms(&self, path: &str) -> Option<u64> {
        self.cx
            .state
            .files
            .get(self.at(path).as_str())
            .map(|file| file.created_at_ms)
    }

    pub async fn edit(
        &mut self,
        path: &str,
        old: &str,
        new: &str,
        all: bool,
    ) -> Result<usize, BackendError> {
        let changed = self
            .backend
            .edit(&self.cx, &self.at(path), old, new, all)
            .await?;
        Ok(self.absorb(changed))
    }

    pub async fn delete(&mut self, path: &str) -> Result<usize, BackendError> {
        let changed = self.backend.delete(&self.cx, &self.at(path)).await?;
        Ok(self.absorb(changed))
    }

    pub async fn upload(&mut self, files: Vec<(&str, Vec<u8>)>) -> Vec<Result<(), FileOpError>> {
        let files = files.into_iter().map(|(p, b)| (self.raw(p), b)).collect();
        let changed = self.backend.upload_files(&self.cx, files).await;
        self.absorb(changed)
    }

    pub async fn download(&self, paths: &[&str]) -> Vec<Result<Vec<u8>, FileOpError>> {
        let paths = paths.iter().map(|p| self.raw(p)).collect();
        self.backend.download_files(&self.cx, paths).await
    }

    pub async fn read(
        &self,
        path: &str,
        offset: usize,
        limit: usize,
    ) -> Result<ReadResult, BackendError> {
        self.backend
            .read(&self.cx, &self.at(path), offset, limit)
            .await
    }

    pub async fn read_raw(&self, path: &str) -> Result<RawFile, BackendError> {
        self.backend.read_raw(&self.cx, &self.at(path)).await
    }

    pub async fn text(&self, path: &str) -> Vec<String> {
        match self.read(path, 0, 10_000).await.unwrap() {
            ReadResult::Text { lines, .. } => lines,
            other => panic!("{path} is not text: {other:?}"),
        }
    }

    pub async fn ls(&self, path: &str) -> Result<Vec<(String, bool)>, BackendError> {
        Ok(self
            .backend
            .ls(&self.cx, &self.at(path))
            .await?
            .into_iter()
            .map(|e| (self.shown(&e.path), e.is_dir))
            .collect())
    }

    pub async fn try_glob(&self, pattern: &str, base: &str) -> Result<Vec<String>, BackendError> {
        Ok(self
            .backend
            .glob(&self.cx, pattern, &self.at(base))
            .await?
            .files
            .into_iter()
            .map(|f| self.shown(&f.path))
            .collect())
    }

    pub async fn glob(&self, pattern: &str, base: &str) -> Vec<String> {
        self.try_glob(pattern, base).await.unwrap()
    }

    /// Runs `query` with its path taken as a case path.
    pub async fn try_grep(&self, query: GrepQuery) -> Result<GrepResult, BackendError> {
        let query = GrepQuery {
            path: query.path.under(&self.root),
            ..query
        };
        self.backend.grep(&self.cx, &query).await
    }

    pub async fn grep(&self, query: GrepQuery) -> (Vec<String>, bool) {
        let result = self.try_grep(query).await.unwrap();
        let found = result
            .matches
            .into_iter()
            .map(|m| format!("{}:{}:{}", self.shown(&m.path), m.line_number, m.line))
            .collect();
        (found, result.truncated)
    }
}

const PNG: &[u8] =
    b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89";

/// Runs every conformance case against a fresh, empty backend.
pub async fn check_backend(backend: Arc<dyn Backend>) {
    run_cases(Harness::new(backend)).await;
}

/// Runs every conformance case with `backend` mounted at `/work/` of a composite whose default
/// is a state backend already holding a file, so each call goes through prefix routing and
/// every path (results and errors) must come back with the prefix.
pub async fn check_mounted(backend: Arc<dyn Backend>) {
    let composite = CompositeBackend::new(Arc::new(StateBackend::default()))
        .route("/work/", backend)
        .unwrap();
    let mut outside = Harness::new(Arc::new(composite));
    outside.write("/outside.md", "needle outside\n").await;
    let h = Harness {
        root: p("/work"),
        ..outside
    };
    run_cases(h).await;
}

/// Runs the cases of the core protocol (write, read and page, list, edit, glob, grep) against
/// a fresh, empty backend: for a backend that implements only the core and keeps the defaults
/// for the rest (no delete, no binary uploads). Without delete, the default `overwrite` (and
/// so an upload over an existing file) cannot replace a file; the suite accepts that it fails
/// then, with the file unchanged.
pub async fn check_core_backend(backend: Arc<dyn Backend>) {
    let mut h = Harness::new(backend);
    let name = h.backend.name();
    write_read_and_page(&mut h).await;
    writing_creates_only(&mut h).await;
    h.write("/core-over.log", "before\n").await;
    match h.try_overwrite("/core-over.log", "after\n").await {
        Ok(()) => assert_eq!(h.read_raw("/core-over.log").await.unwrap().data, b"after\n"),
        Err(error) => {
            assert!(
                matches!(
                    error,
                    BackendError::Unsupported {
                        operation: "delete",
                        ..
                    }
                ),
                "overwrite without delete says delete is missing: {error}"
            );
            assert_eq!(
                h.read_raw("/core-over.log").await.unwrap().data,
                b"before\n",
                "a failed overwrite changes nothing"
            );
        }
    }
    listing(&mut h).await;
    editing(&mut h).await;
    globbing(&mut h).await;
    grepping(&mut h).await;
    // The defaults built on the core: UTF-8 uploads are written, other bytes refused per path.
    let answers = h
        .upload(vec![
            ("/up.txt", b"up\n".to_vec()),
            ("/up.bin", vec![0xff, 0xfe, 0]),
        ])
        .await;
    assert_eq!(answers, [Ok(()), Err(FileOpError::InvalidPath)]);
    assert_eq!(h.download(&["/up.txt"]).await, [Ok(b"up\n".to_vec())]);
    eprintln!("core conformance passed: {name} at {}", h.root);
}

/// Runs every conformance case for a backend that stores text only (such as the repository
/// backend): all but the cases that upload binary or non-UTF-8 bytes, which must instead be
/// refused per path as `invalid_path` with nothing stored.
pub async fn check_text_backend(backend: Arc<dyn Backend>) {
    run_text_cases(Harness::new(backend)).await;
}

/// [`check_text_backend`] with the backend mounted at `/work/` of a composite, as
/// [`check_mounted`] does.
pub async fn check_text_mounted(backend: Arc<dyn Backend>) {
    let composite = CompositeBackend::new(Arc::new(StateBackend::default()))
        .route("/work/", backend)
        .unwrap();
    let mut outside = Harness::new(Arc::new(composite));
    outside.write("/outside.md", "needle outside\n").await;
    let h = Harness {
        root: p("/work"),
        ..outside
    };
    run_text_cases(h).await;
}

async fn run_text_cases(mut h: Harness) {
    let name = h.backend.name();
    write_read_and_page(&mut h).await;
    writing_creates_only(&mut h).await;
    overwriting(&mut h).await;
    listing(&mut h).await;
    editing(&mut h).await;
    globbing(&mut h).await;
    grepping(&mut h).await;
    text_under_binary_names(&mut h).await;
    deleting(&mut h).await;
    siblings_that_sort_between_a_directory_and_its_files(&mut h).await;
    let answers = h
        .upload(vec![
            ("/text-only/ok.txt", b"ok\n".to_vec()),
            ("/text-only/pixel.png", PNG.to_vec()),
            ("/text-only/latin.txt", b"caf\xe9\n".to_vec()),
        ])
        .await;
    assert_eq!(
        answers,
        [
            Ok(()),
            Err(FileOpError::InvalidPath),
            Err(FileOpError::InvalidPath)
        ],
        "a text-only backend refuses other bytes per path"
    );
    assert_eq!(
        h.download(&["/text-only/ok.txt", "/text-only/pixel.png"])
            .await,
        [Ok(b"ok\n".to_vec()), Err(FileOpError::FileNotFound)]
    );
    eprintln!("text conformance passed: {name} at {}", h.root);
}

async fn run_cases(mut h: Harness) {
    let name = h.backend.name();
    write_read_and_page(&mut h).await;
    writing_creates_only(&mut h).await;
    overwriting(&mut h).await;
    listing(&mut h).await;
    editing(&mut h).await;
    globbing(&mut h).await;
    grepping(&mut h).await;
    binary_and_batches(&mut h).await;
    multimodal_types(&mut h).await;
    text_under_binary_names(&mut h).await;
    text_that_is_not_utf8(&mut h).await;
    deleting(&mut h).await;
    siblings_that_sort_between_a_directory_and_its_files(&mut h).await;
    eprintln!("conformance passed: {name} at {}", h.root);
}

async fn write_read_and_page(h: &mut Harness) {
    h.write("/notes.txt", "hello\nworld\n").await;
    assert_eq!(h.text("/notes.txt").await, ["hello", "world"]);
    let page = h.read("/notes.txt", 1, 1).await.unwrap();
    assert_eq!(
        page,
        ReadResult::Text {
            lines: vec!["world".into()],
            offset: 1,
            total_lines: 2
        }
    );
    assert_eq!(page.next_offset(), None);
    let first = h.read("/notes.txt", 0, 1).await.unwrap();
    assert_eq!(first.next_offset(), Some(1));
    let past = h.read("/notes.txt", 9, 5).await.unwrap();
    assert_eq!(
        past,
        ReadResult::Text {
            lines: vec![],
            offset: 9,
            total_lines: 2
        }
    );
    h.write("/crlf.txt", "a\r\nb\r\n").await;
    assert_eq!(h.text("/crlf.txt").await, ["a", "b"]);
    h.write("/empty.txt", "").await;
    let empty = h.read("/empty.txt", 0, 10).await.unwrap();
    assert_eq!(
        empty,
        ReadResult::Text {
            lines: vec![],
            offset: 0,
            total_lines: 0
        }
    );
    // Extended in place of a rewrite, which write refuses.
    assert_eq!(
        h.edit("/notes.txt", "world\n", "world\nagain\n", false)
            .await
            .unwrap(),
        1
    );
    assert_eq!(h.text("/notes.txt").await.len(), 3);
    let raw = h.read_raw("/notes.txt").await.unwrap();
    assert_eq!(raw.data, b"hello\nworld\nagain\n");
    assert!(raw.mime_type.starts_with("text/plain"), "{}", raw.mime_type);
    let missing = h.read("/missing.txt", 0, 10).await.unwrap_err();
    assert!(
        matches!(missing, BackendError::NotFound { .. }),
        "{missing}"
    );
    h.assert_names(&missing, "/missing.txt");
    let missing = h.read_raw("/missing.txt").await.unwrap_err();
    h.assert_names(&missing, "/missing.txt");
}

/// write only creates: over an existing file it fails, names the path, says what to do
/// instead, and changes nothing.
async fn writing_creates_only(h: &mut Harness) {
    h.write("/once.log", "first\n").await;
    let again = h.try_write("/once.log", "second\n").await.unwrap_err();
    assert!(
        matches!(again, BackendError::AlreadyExists { .. }),
        "write over an existing file: {again}"
    );
    h.assert_names(&again, "/once.log");
    assert!(again.to_string().contains("edit_file"), "{again}");
    assert_eq!(h.read_raw("/once.log").await.unwrap().data, b"first\n");
    assert_eq!(h.text("/once.log").await, ["first"]);
    // Nor does an empty write slip through.
    let empty = h.try_write("/once.log", "").await.unwrap_err();
    assert!(
        matches!(empty, BackendError::AlreadyExists { .. }),
        "{empty}"
    );
    assert_eq!(h.read_raw("/once.log").await.unwrap().data, b"first\n");
}

/// overwrite creates or replaces (keeping the creation time where the backend reports one),
/// with write's checks on directories; uploads replace too.
async fn overwriting(h: &mut Harness) {
    h.write("/over.txt", "one\n").await;
    let created = h.created_at_ms("/over.txt");
    // So a replacement that took a new creation time would show a different one.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    h.overwrite("/over.txt", "two\nlines\n").await;
    assert_eq!(h.text("/over.txt").await, ["two", "lines"]);
    assert_eq!(
        h.created_at_ms("/over.txt"),
        created,
        "an overwrite keeps the creation time"
    );
    h.overwrite("/over/new.txt", "fresh\n").await;
    assert_eq!(
        h.text("/over/new.txt").await,
        ["fresh"],
        "overwrite creates"
    );
    let over_dir = h.try_overwrite("/over", "x").await.unwrap_err();
    assert!(
        matches!(over_dir, BackendError::IsDirectory { .. }),
        "{over_dir}"
    );
    h.assert_names(&over_dir, "/over");
    let under_file = h.try_overwrite("/over.txt/child", "x").await.unwrap_err();
    assert!(
        matches!(under_file, BackendError::NotADirectory { .. }),
        "{under_file}"
    );
    h.assert_names(&under_file, "/over.txt");
    assert_eq!(
        h.upload(vec![("/over.txt", b"uploaded\n".to_vec())]).await,
        [Ok(())],
        "an upload replaces an existing file"
    );
    assert_eq!(h.read_raw("/over.txt").await.unwrap().data, b"uploaded\n");
    assert_eq!(h.created_at_ms("/over.txt"), created);
    assert_eq!(h.delete("/over").await.unwrap(), 1);
    assert_eq!(h.delete("/over.txt").await.unwrap(), 1);
}

async fn listing(h: &mut Harness) {
    h.write("/dir/sub/deep.md", "# deep\nneedle here\n").await;
    h.write("/dir/top.md", "top needle\n").await;
    let root = h.ls("/").await.unwrap();
    assert!(root.contains(&("/dir".into(), true)), "{root:?}");
    assert!(root.contains(&("/notes.txt".into(), false)), "{root:?}");
    let mut sorted = root.clone();
    sorted.sort();
    assert_eq!(root, sorted, "ls is sorted");
    assert_eq!(
        h.ls("/dir").await.unwrap(),
        [("/dir/sub".into(), true), ("/dir/top.md".into(), false)]
    );
    let entry = &h.backend.ls(&h.cx, &h.at("/dir")).await.unwrap()[1];
    assert_eq!(entry.size, 11);
    let nowhere = h.ls("/nowhere").await.unwrap_err();
    assert!(
        matches!(nowhere, BackendError::NotFound { .. }),
        "{nowhere}"
    );
    h.assert_names(&nowhere, "/nowhere");
    let file = h.ls("/notes.txt").await.unwrap_err();
    assert!(matches!(file, BackendError::NotADirectory { .. }), "{file}");
    h.assert_names(&file, "/notes.txt");
    let dir = h.read("/dir", 0, 10).await.unwrap_err();
    assert!(matches!(dir, BackendError::IsDirectory { .. }), "{dir}");
    h.assert_names(&dir, "/dir");
    let over_dir = h.try_write("/dir", "x").await.unwrap_err();
    assert!(matches!(over_dir, BackendError::IsDirectory { .. }));
    h.assert_names(&over_dir, "/dir");
    let under_file = h.try_write("/notes.txt/child", "x").await.unwrap_err();
    assert!(matches!(under_file, BackendError::NotADirectory { .. }));
    h.assert_names(&under_file, "/notes.txt");
}

async fn editing(h: &mut Harness) {
    h.write("/edit.txt", "one two two three\n").await;
    assert_eq!(h.edit("/edit.txt", "one", "1", false).await.unwrap(), 1);
    let twice = h.edit("/edit.txt", "two", "2", false).await.unwrap_err();
    assert!(matches!(twice, BackendError::NotUnique { count: 2, .. }));
    h.assert_names(&twice, "/edit.txt");
    assert_eq!(h.edit("/edit.txt", "two", "2", true).await.unwrap(), 2);
    assert_eq!(h.text("/edit.txt").await, ["1 2 2 three"]);
    let absent = h.edit("/edit.txt", "four", "4", false).await.unwrap_err();
    assert!(matches!(absent, BackendError::StringNotFound { .. }));
    h.assert_names(&absent, "/edit.txt");
    let missing = h.edit("/nope.txt", "a", "b", false).await.unwrap_err();
    assert!(matches!(missing, BackendError::NotFound { .. }));
    h.assert_names(&missing, "/nope.txt");
    let error = h.edit("/edit.txt", "", "x", false).await.unwrap_err();
    assert!(error.to_string().contains("write_file"), "{error}");
}

async fn globbing(h: &mut Harness) {
    h.write("/.env", "SECRET=1\n").await;
    h.write("/dir/.hidden/x.md", "hidden\n").await;
    assert_eq!(
        h.glob("*.md", "/").await,
        ["/dir/sub/deep.md", "/dir/top.md"]
    );
    assert_eq!(h.glob("dir/*.md", "/").await, ["/dir/top.md"]);
    assert_eq!(h.glob("/dir/*.md", "/").await, ["/dir/top.md"]);
    assert_eq!(
        h.glob("dir/**/*.md", "/").await,
        ["/dir/sub/deep.md", "/dir/top.md"]
    );
    assert_eq!(h.glob("*.md", "/dir/sub").await, ["/dir/sub/deep.md"]);
    assert_eq!(
        h.glob("*.{md,txt}", "/").await,
        [
            "/crlf.txt",
            "/dir/sub/deep.md",
            "/dir/top.md",
            "/edit.txt",
            "/empty.txt",
            "/notes.txt"
        ]
    );
    assert_eq!(h.glob("**/.env", "/").await, ["/.env"]);
    assert_eq!(h.glob(".hidden/*.md", "/dir").await, ["/dir/.hidden/x.md"]);
    assert!(h.glob("*.rs", "/").await.is_empty());
    assert!(
        h.glob("sub", "/dir").await.is_empty(),
        "directories never match"
    );
}

async fn grepping(h: &mut Harness) {
    let query = |pattern: &str| GrepQuery::literal(pattern, p("/"));
    let (found, truncated) = h.grep(query("needle")).await;
    assert_eq!(
        found,
        ["/dir/sub/deep.md:2:needle here", "/dir/top.md:1:top needle"]
    );
    assert!(!truncated);
    // Literal by default: regex metacharacters match themselves.
    assert!(h.grep(query("h.llo")).await.0.is_empty());
    let (found, _) = h
        .grep(GrepQuery {
            regex: true,
            ..query("^h.llo$")
        })
        .await;
    assert_eq!(found, ["/notes.txt:1:hello"]);
    let (found, _) = h
        .grep(GrepQuery {
            case_insensitive: true,
            ..query("HELLO")
        })
        .await;
    assert_eq!(found, ["/notes.txt:1:hello"]);
    let (found, _) = h
        .grep(GrepQuery {
            include: Some("top.*".into()),
            ..query("needle")
        })
        .await;
    assert_eq!(found, ["/dir/top.md:1:top needle"]);
    let (found, _) = h
        .grep(GrepQuery {
            include: Some("dir/sub/*.md".into()),
            ..query("needle")
        })
        .await;
    assert_eq!(found, ["/dir/sub/deep.md:2:needle here"]);
    let (found, _) = h
        .grep(GrepQuery {
            path: p("/dir/sub"),
            ..query("needle")
        })
        .await;
    assert_eq!(found, ["/dir/sub/deep.md:2:needle here"]);
    let (found, _) = h
        .grep(GrepQuery {
            path: p("/dir/top.md"),
            include: Some("*.md".into()),
            ..query("needle")
        })
        .await;
    assert_eq!(found, ["/dir/top.md:1:top needle"], "grep of one file");
    let (found, truncated) = h
        .grep(GrepQuery {
            max_count: 1,
            ..query("needle")
        })
        .await;
    assert_eq!(found, ["/dir/sub/deep.md:2:needle here"]);
    assert!(truncated);
    let missing = h
        .try_grep(GrepQuery {
            path: p("/gone"),
            ..query("needle")
        })
        .await
        .unwrap_err();
    assert!(
        matches!(missing, BackendError::NotFound { .. }),
        "{missing}"
    );
    h.assert_names(&missing, "/gone");
    let error = h
        .try_grep(GrepQuery {
            regex: true,
            ..query("(unclosed")
        })
        .await
        .unwrap_err();
    assert!(matches!(
        error,
        BackendError::InvalidQuery { what: "regex", .. }
    ));
}

async fn binary_and_batches(h: &mut Harness) {
    let answers = h
        .upload(vec![
            ("/img/pixel.png", PNG.to_vec()),
            ("../escape", b"x".to_vec()),
            ("/img/latin1.txt", vec![b'c', b'a', b'f', 0xe9]),
            ("/img/utf8.txt", "naïve ✓\n".as_bytes().to_vec()),
        ])
        .await;
    assert_eq!(
        answers,
        [Ok(()), Err(FileOpError::InvalidPath), Ok(()), Ok(())]
    );
    match h.read("/img/pixel.png", 0, 10).await.unwrap() {
        ReadResult::Binary { mime_type, data } => {
            assert_eq!(mime_type, "image/png");
            assert_eq!(data, PNG);
        }
        other => panic!("expected binary, got {other:?}"),
    }
    // Latin-1 is text: its invalid byte reads as U+FFFD.
    assert_eq!(h.text("/img/latin1.txt").await, ["caf\u{FFFD}"]);
    assert_eq!(h.text("/img/utf8.txt").await, ["naïve ✓"]);
    let binary = h
        .edit("/img/pixel.png", "PNG", "JPG", false)
        .await
        .unwrap_err();
    assert!(matches!(binary, BackendError::Binary { .. }));
    h.assert_names(&binary, "/img/pixel.png");
    // Binary files never show up in grep.
    assert!(
        h.grep(GrepQuery::literal("PNG", p("/img")))
            .await
            .0
            .is_empty()
    );
    let downloads = h
        .download(&["/img/pixel.png", "/img/none.png", "/img", "relative"])
        .await;
    assert_eq!(
        downloads,
        [
            Ok(PNG.to_vec()),
            Err(FileOpError::FileNotFound),
            Err(FileOpError::IsDirectory),
            Err(FileOpError::InvalidPath)
        ]
    );
}

async fn deleting(h: &mut Harness) {
    assert_eq!(h.delete("/dir").await.unwrap(), 3);
    assert!(matches!(
        h.ls("/dir").await,
        Err(BackendError::NotFound { .. })
    ));
    assert!(h.glob("*.md", "/").await.is_empty());
    assert_eq!(h.delete("/notes.txt").await.unwrap(), 1);
    let gone = h.delete("/notes.txt").await.unwrap_err();
    assert!(matches!(gone, BackendError::NotFound { .. }), "{gone}");
    h.assert_names(&gone, "/notes.txt");
    assert!(h.delete("/").await.is_err(), "the root cannot be deleted");
}

/// Byte order puts `.`, `-`, space, `!` and `+` before `/`, so `/s/notes.md` sorts between
/// `/s/notes` and `/s/notes/a.md`: a directory must still be found past such siblings.
async fn siblings_that_sort_between_a_directory_and_its_files(h: &mut Harness) {
    for sibling in [
        "/s/notes.md",
        "/s/notes-old/x.md",
        "/s/notes old.md",
        "/s/notes!.md",
        "/s/notes+1/y.md",
    ] {
        h.write(sibling, "needle sibling\n").await;
    }
    h.write("/s/notes/a.md", "needle inside\n").await;
    h.write("/s/notes/deeper/b.md", "needle deeper\n").await;
    assert_eq!(
        h.ls("/s/notes").await.unwrap(),
        [
            ("/s/notes/a.md".into(), false),
            ("/s/notes/deeper".into(), true)
        ]
    );
    let dir = h.read("/s/notes", 0, 10).await.unwrap_err();
    assert!(matches!(dir, BackendError::IsDirectory { .. }), "{dir}");
    assert_eq!(
        h.download(&["/s/notes"]).await,
        [Err(FileOpError::IsDirectory)]
    );
    let over_dir = h.try_write("/s/notes", "x").await.unwrap_err();
    assert!(
        matches!(over_dir, BackendError::IsDirectory { .. }),
        "{over_dir}"
    );
    assert_eq!(
        h.upload(vec![("/s/notes", b"x".to_vec())]).await,
        [Err(FileOpError::IsDirectory)]
    );
    assert_eq!(
        h.glob("*.md", "/s/notes").await,
        ["/s/notes/a.md", "/s/notes/deeper/b.md"]
    );
    let (found, truncated) = h.grep(GrepQuery::literal("needle", p("/s/notes"))).await;
    assert_eq!(
        found,
        [
            "/s/notes/a.md:1:needle inside",
            "/s/notes/deeper/b.md:1:needle deeper"
        ]
    );
    assert!(!truncated);
    assert_eq!(h.delete("/s/notes").await.unwrap(), 2);
    assert!(matches!(
        h.ls("/s/notes").await,
        Err(BackendError::NotFound { .. })
    ));
    assert_eq!(
        h.glob("*", "/s").await,
        [
            "/s/notes old.md",
            "/s/notes!.md",
            "/s/notes+1/y.md",
            "/s/notes-old/x.md",
            "/s/notes.md"
        ],
        "the siblings survive the delete"
    );
    assert_eq!(h.delete("/s").await.unwrap(), 5);
}

/// Every multimodal signature comes back as binary with its media type, whatever backend holds
/// the bytes; so does content without a signature under a media extension.
async fn multimodal_types(h: &mut Harness) {
    let mut samples: Vec<(String, Vec<u8>, &str)> = signatures()
        .into_iter()
        .enumerate()
        .map(|(i, (_, bytes, mime))| (format!("/media/sniffed-{i}"), bytes, mime))
        .collect();
    samples.push((
        "/media/clip.MOV".into(),
        b"\x01\x02 no signature".to_vec(),
        "video/quicktime",
    ));
    samples.push(("/media/voice.aac".into(), b"\x00\x01".to_vec(), "audio/aac"));
    let uploads = samples
        .iter()
        .map(|(path, bytes, _)| (path.as_str(), bytes.clone()))
        .collect();
    let answers = h.upload(uploads).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    for (path, bytes, mime) in &samples {
        match h.read(path, 0, 10).await.unwrap() {
            ReadResult::Binary { mime_type, data } => {
                assert_eq!(mime_type, *mime, "{path}");
                assert_eq!(&data, bytes, "{path}");
            }
            other => panic!("{path} ({mime}) read as {other:?}"),
        }
        assert_eq!(h.read_raw(path).await.unwrap().mime_type, *mime, "{path}");
    }
    let paths: Vec<&str> = samples.iter().map(|(path, ..)| path.as_str()).collect();
    let downloads = h.download(&paths).await;
    let expected: Vec<_> = samples
        .iter()
        .map(|(_, bytes, _)| Ok(bytes.clone()))
        .collect();
    assert_eq!(downloads, expected);
    assert_eq!(h.delete("/media").await.unwrap(), samples.len());
}

/// Text written under a binary name (an SVG, or text that starts with a PDF signature) is
/// binary on every backend, exactly as the same bytes on disk: read returns the bytes with the
/// media type, edit refuses, grep skips.
async fn text_under_binary_names(h: &mut Harness) {
    let svg = "<svg xmlns=\"http://www.w3.org/2000/svg\"><text>needle</text></svg>\n";
    let pdf = "%PDF-1.4 needle\n";
    h.write("/pic.svg", svg).await;
    h.write("/looks-like.txt", pdf).await;
    for (path, mime, content) in [
        ("/pic.svg", "image/svg+xml", svg),
        ("/looks-like.txt", "application/pdf", pdf),
    ] {
        assert_eq!(
            h.read(path, 0, 10).await.unwrap(),
            ReadResult::Binary {
                mime_type: mime.into(),
                data: content.as_bytes().to_vec()
            },
            "{path}"
        );
        let raw = h.read_raw(path).await.unwrap();
        assert_eq!(
            (raw.mime_type.as_str(), &raw.data[..]),
            (mime, content.as_bytes())
        );
        let error = h.edit(path, "needle", "pin", false).await.unwrap_err();
        assert_eq!(
            error,
            BackendError::Binary {
                path: h.at(path).to_string(),
                mime_type: mime.into()
            }
        );
        assert_eq!(h.download(&[path]).await, [Ok(content.as_bytes().to_vec())]);
    }
    let (found, _) = h.grep(GrepQuery::literal("needle", p("/"))).await;
    assert!(
        !found
            .iter()
            .any(|m| m.starts_with("/pic.svg") || m.starts_with("/looks-like")),
        "binary files are not searched: {found:?}"
    );
    // Replacing it with text is always allowed: the agent can still replace the file.
    let again = h.try_write("/pic.svg", "<svg/>").await.unwrap_err();
    assert!(
        matches!(again, BackendError::AlreadyExists { .. }),
        "{again}"
    );
    h.overwrite("/pic.svg", "<svg/>").await;
    assert_eq!(h.read_raw("/pic.svg").await.unwrap().data, b"<svg/>");
    assert_eq!(h.delete("/pic.svg").await.unwrap(), 1);
    assert_eq!(h.delete("/looks-like.txt").await.unwrap(), 1);
}

/// Text that is not UTF-8 (here Latin-1) is text on every backend, as ripgrep has it: read
/// shows its invalid bytes as U+FFFD, grep finds its lines (shown the same way) and names the
/// binary files it skipped, and an edit either keeps every byte it does not replace or refuses
/// and says why, never rewriting the other bytes.
async fn text_that_is_not_utf8(h: &mut Harness) {
    const LATIN1: &[u8] = b"caf\xe9 cr\xe8me\nneedle here\n";
    let answers = h
        .upload(vec![
            ("/latin/menu.txt", LATIN1.to_vec()),
            ("/latin/pixel.png", PNG.to_vec()),
            ("/latin/blob.dat", b"needle\0here\n".to_vec()),
        ])
        .await;
    assert_eq!(answers, [Ok(()), Ok(()), Ok(())]);
    assert_eq!(
        h.text("/latin/menu.txt").await,
        ["caf\u{FFFD} cr\u{FFFD}me", "needle here"]
    );
    let raw = h.read_raw("/latin/menu.txt").await.unwrap();
    assert_eq!(
        (raw.mime_type.as_str(), &raw.data[..]),
        ("text/plain", LATIN1)
    );
    let (found, _) = h.grep(GrepQuery::literal("needle", p("/latin"))).await;
    assert_eq!(found, ["/latin/menu.txt:2:needle here"]);
    let (found, _) = h.grep(GrepQuery::literal("cr", p("/latin"))).await;
    assert_eq!(found, ["/latin/menu.txt:1:caf\u{FFFD} cr\u{FFFD}me"]);
    let result = h
        .try_grep(GrepQuery::literal("needle", p("/latin")))
        .await
        .unwrap();
    let skipped: Vec<(String, SkipReason)> = result
        .skipped
        .into_iter()
        .map(|s| (h.shown(&s.path), s.reason))
        .collect();
    assert_eq!(
        skipped,
        [
            (
                "/latin/blob.dat".to_owned(),
                SkipReason::Binary {
                    mime_type: "application/octet-stream".into()
                }
            ),
            (
                "/latin/pixel.png".to_owned(),
                SkipReason::Binary {
                    mime_type: "image/png".into()
                }
            ),
        ],
        "grep names the binary files it did not search, by the paths the agent sees"
    );
    let count = h
        .edit("/latin/menu.txt", "here", "there", false)
        .await
        .unwrap();
    assert_eq!(count, 1);
    assert_eq!(
        h.read_raw("/latin/menu.txt").await.unwrap().data,
        b"caf\xe9 cr\xe8me\nneedle there\n",
        "the bytes the edit did not replace are kept"
    );
    assert_eq!(h.delete("/latin").await.unwrap(), 3);
}

// ---- sample files of every media type -----------------------------------------------

/// The media type of legacy PowerPoint files.
pub const PPT: &str = "application/vnd.ms-powerpoint";
/// The media type of PowerPoint (OOXML) files.
pub const PPTX: &str = "application/vnd.openxmlformats-officedocument.presentationml.presentation";
/// The start of an OLE2 compound file.
pub const OLE2: &[u8] = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1\0\0\0\0\0\0\0\0";
/// The start of an ASF (WMV/WMA) file.
pub const ASF: &[u8] = b"\x30\x26\xb2\x75\x8e\x66\xcf\x11\xa6\xd9\x00\xaa\x00\x62\xce\x6c\0\0";

/// `text` as UTF-16LE bytes.
pub fn utf16le(text: &str) -> Vec<u8> {
    text.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

/// An OLE2 compound file whose directory names `stream`.
pub fn ole2_with(stream: &str) -> Vec<u8> {
    let mut bytes = OLE2.to_vec();
    bytes.resize(512, 0);
    bytes.extend(utf16le(stream));
    bytes
}

/// The start of a zip archive holding `names` (local file headers, stored, empty).
pub fn zip_with(names: &[&str]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for name in names {
        // Signature, version needed, then flags, method, time, date, CRC and sizes, all zero.
        bytes.extend_from_slice(b"PK\x03\x04\x14\0");
        bytes.extend_from_slice(&[0; 20]);
        let len = u16::try_from(name.len()).unwrap();
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(&[0, 0]);
        bytes.extend_from_slice(name.as_bytes());
    }
    bytes
}

/// Tiny synthetic headers: just enough bytes for each format's signature.
pub fn signatures() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let pptx = zip_with(&["[Content_Types].xml", "_rels/.rels", "ppt/presentation.xml"]);
    vec![
        (
            "png",
            b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec(),
            "image/png",
        ),
        (
            "jpeg",
            b"\xff\xd8\xff\xe0\0\x10JFIF\0".to_vec(),
            "image/jpeg",
        ),
        (
            "gif89a",
            b"GIF89a\x01\0\x01\0\x80\0\0".to_vec(),
            "image/gif",
        ),
        ("gif87a", b"GIF87a\x01\0\x01\0\0\0\0".to_vec(), "image/gif"),
        ("webp", b"RIFF\x24\0\0\0WEBPVP8 ".to_vec(), "image/webp"),
        (
            "heic",
            b"\0\0\0\x18ftypheic\0\0\0\0mif1heic".to_vec(),
            "image/heic",
        ),
        (
            "heif",
            b"\0\0\0\x18ftypmif1\0\0\0\0mif1heic".to_vec(),
            "image/heif",
        ),
        ("wav", b"RIFF\x24\0\0\0WAVEfmt ".to_vec(), "audio/wav"),
        ("mp3 id3", b"ID3\x04\0\0\0\0\0\x21".to_vec(), "audio/mpeg"),
        (
            "mp3 frame",
            b"\xff\xfb\x90\x64\0\0\0\0".to_vec(),
            "audio/mpeg",
        ),
        (
            "mp3 mpeg2 frame",
            b"\xff\xf3\x48\xc4\0\0".to_vec(),
            "audio/mpeg",
        ),
        ("aiff", b"FORM\0\0\0\x2eAIFFCOMM".to_vec(), "audio/aiff"),
        ("aifc", b"FORM\0\0\0\x2eAIFCFVER".to_vec(), "audio/aiff"),
        (
            "aac adts",
            b"\xff\xf1\x50\x80\x02\x1f\xfc".to_vec(),
            "audio/aac",
        ),
        (
            "aac adts mpeg2",
            b"\xff\xf9\x50\x80\x02\x1f\xfc".to_vec(),
            "audio/aac",
        ),
        ("ogg", b"OggS\0\x02\0\0\0\0".to_vec(), "audio/ogg"),
        ("flac", b"fLaC\0\0\0\x22".to_vec(), "audio/flac"),
        (
            "mp4",
            b"\0\0\0\x20ftypisom\0\0\x02\0isomiso2".to_vec(),
            "video/mp4",
        ),
        (
            "webm",
            b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01".to_vec(),
            "video/webm",
        ),
        (
            "mpeg ps",
            b"\0\0\x01\xba\x44\0\x04\0".to_vec(),
            "video/mpeg",
        ),
        (
            "mpeg es",
            b"\0\0\x01\xb3\x16\0\xf0\x15".to_vec(),
            "video/mpeg",
        ),
        (
            "mov",
            b"\0\0\0\x14ftypqt  \0\0\0\0qt  ".to_vec(),
            "video/quicktime",
        ),
        ("avi", b"RIFF\x24\0\0\0AVI LIST".to_vec(), "video/x-msvideo"),
        ("flv", b"FLV\x01\x05\0\0\0\x09".to_vec(), "video/x-flv"),
        ("3gpp", b"\0\0\0\x14ftyp3gp5\0\0\0\0".to_vec(), "video/3gpp"),
        ("asf", ASF.to_vec(), "video/x-ms-asf"),
        (
            "pdf",
            b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n".to_vec(),
            "application/pdf",
        ),
        ("ppt", ole2_with("PowerPoint Document"), PPT),
        ("pptx", pptx, PPTX),
    ]
}
