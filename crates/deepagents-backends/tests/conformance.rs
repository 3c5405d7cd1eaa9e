//! The cases every backend must pass. Backend-specific modules call [`check_backend`].

use std::sync::Arc;

use deepagents_backends::{
    Backend, BackendContext, BackendError, Changed, FileOpError, GrepQuery, ReadResult, VPath,
};
use deepagents_core::StateSchema;

/// A backend with a context whose state absorbs every update, as a run would.
pub struct Harness {
    pub backend: Arc<dyn Backend>,
    pub cx: BackendContext,
}

pub fn p(path: &str) -> VPath {
    VPath::parse(path).unwrap()
}

impl Harness {
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self {
            backend,
            cx: BackendContext::default(),
        }
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
        let changed = self
            .backend
            .write(&self.cx, &p(path), content)
            .await
            .unwrap();
        self.absorb(changed);
    }

    pub async fn try_write(&mut self, path: &str, content: &str) -> Result<(), BackendError> {
        let changed = self.backend.write(&self.cx, &p(path), content).await?;
        self.absorb(changed);
        Ok(())
    }

    pub async fn edit(
        &mut self,
        path: &str,
        old: &str,
        new: &str,
        all: bool,
    ) -> Result<usize, BackendError> {
        let changed = self.backend.edit(&self.cx, &p(path), old, new, all).await?;
        Ok(self.absorb(changed))
    }

    pub async fn delete(&mut self, path: &str) -> Result<usize, BackendError> {
        let changed = self.backend.delete(&self.cx, &p(path)).await?;
        Ok(self.absorb(changed))
    }

    pub async fn upload(&mut self, files: Vec<(&str, Vec<u8>)>) -> Vec<Result<(), FileOpError>> {
        let files = files.into_iter().map(|(p, b)| (p.to_owned(), b)).collect();
        let changed = self.backend.upload_files(&self.cx, files).await;
        self.absorb(changed)
    }

    pub async fn text(&self, path: &str) -> Vec<String> {
        match self
            .backend
            .read(&self.cx, &p(path), 0, 10_000)
            .await
            .unwrap()
        {
            ReadResult::Text { lines, .. } => lines,
            other => panic!("{path} is not text: {other:?}"),
        }
    }

    pub async fn ls(&self, path: &str) -> Result<Vec<(String, bool)>, BackendError> {
        Ok(self
            .backend
            .ls(&self.cx, &p(path))
            .await?
            .into_iter()
            .map(|e| (e.path, e.is_dir))
            .collect())
    }

    pub async fn glob(&self, pattern: &str, base: &str) -> Vec<String> {
        self.backend
            .glob(&self.cx, pattern, &p(base))
            .await
            .unwrap()
            .files
            .into_iter()
            .map(|f| f.path)
            .collect()
    }

    pub async fn grep(&self, query: GrepQuery) -> (Vec<String>, bool) {
        let result = self.backend.grep(&self.cx, &query).await.unwrap();
        let found = result
            .matches
            .into_iter()
            .map(|m| format!("{}:{}:{}", m.path, m.line_number, m.line))
            .collect();
        (found, result.truncated)
    }
}

const PNG: &[u8] =
    b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89";

/// Runs every conformance case against a fresh, empty backend.
pub async fn check_backend(backend: Arc<dyn Backend>) {
    let mut h = Harness::new(backend);
    let name = h.backend.name();
    write_read_and_page(&mut h).await;
    listing(&mut h).await;
    editing(&mut h).await;
    globbing(&mut h).await;
    grepping(&mut h).await;
    binary_and_batches(&mut h).await;
    deleting(&mut h).await;
    eprintln!("conformance passed: {name}");
}

async fn write_read_and_page(h: &mut Harness) {
    h.write("/notes.txt", "hello\nworld\n").await;
    assert_eq!(h.text("/notes.txt").await, ["hello", "world"]);
    let page = h.backend.read(&h.cx, &p("/notes.txt"), 1, 1).await.unwrap();
    assert_eq!(
        page,
        ReadResult::Text {
            lines: vec!["world".into()],
            offset: 1,
            total_lines: 2
        }
    );
    assert_eq!(page.next_offset(), None);
    let first = h.backend.read(&h.cx, &p("/notes.txt"), 0, 1).await.unwrap();
    assert_eq!(first.next_offset(), Some(1));
    let past = h.backend.read(&h.cx, &p("/notes.txt"), 9, 5).await.unwrap();
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
    let empty = h
        .backend
        .read(&h.cx, &p("/empty.txt"), 0, 10)
        .await
        .unwrap();
    assert_eq!(
        empty,
        ReadResult::Text {
            lines: vec![],
            offset: 0,
            total_lines: 0
        }
    );
    // Overwrite.
    h.write("/notes.txt", "hello\nworld\nagain\n").await;
    assert_eq!(h.text("/notes.txt").await.len(), 3);
    let raw = h.backend.read_raw(&h.cx, &p("/notes.txt")).await.unwrap();
    assert_eq!(raw.data, b"hello\nworld\nagain\n");
    assert!(raw.mime_type.starts_with("text/plain"), "{}", raw.mime_type);
    assert!(matches!(
        h.backend.read(&h.cx, &p("/missing.txt"), 0, 10).await,
        Err(BackendError::NotFound { .. })
    ));
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
    let entry = &h.backend.ls(&h.cx, &p("/dir")).await.unwrap()[1];
    assert_eq!(entry.size, 11);
    assert!(matches!(
        h.ls("/nowhere").await,
        Err(BackendError::NotFound { .. })
    ));
    assert!(matches!(
        h.ls("/notes.txt").await,
        Err(BackendError::NotADirectory { .. })
    ));
    assert!(matches!(
        h.backend.read(&h.cx, &p("/dir"), 0, 10).await,
        Err(BackendError::IsDirectory { .. })
    ));
    assert!(matches!(
        h.try_write("/dir", "x").await,
        Err(BackendError::IsDirectory { .. })
    ));
    assert!(matches!(
        h.try_write("/notes.txt/child", "x").await,
        Err(BackendError::NotADirectory { .. })
    ));
}

async fn editing(h: &mut Harness) {
    h.write("/edit.txt", "one two two three\n").await;
    assert_eq!(h.edit("/edit.txt", "one", "1", false).await.unwrap(), 1);
    assert!(matches!(
        h.edit("/edit.txt", "two", "2", false).await,
        Err(BackendError::NotUnique { count: 2, .. })
    ));
    assert_eq!(h.edit("/edit.txt", "two", "2", true).await.unwrap(), 2);
    assert_eq!(h.text("/edit.txt").await, ["1 2 2 three"]);
    assert!(matches!(
        h.edit("/edit.txt", "four", "4", false).await,
        Err(BackendError::StringNotFound { .. })
    ));
    assert!(matches!(
        h.edit("/nope.txt", "a", "b", false).await,
        Err(BackendError::NotFound { .. })
    ));
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
            path: p("/dir/sub"),
            ..query("needle")
        })
        .await;
    assert_eq!(found, ["/dir/sub/deep.md:2:needle here"]);
    let (found, truncated) = h
        .grep(GrepQuery {
            max_count: 1,
            ..query("needle")
        })
        .await;
    assert_eq!(found.len(), 1);
    assert!(truncated);
    let error = h
        .backend
        .grep(
            &h.cx,
            &GrepQuery {
                regex: true,
                ..query("(unclosed")
            },
        )
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
    match h
        .backend
        .read(&h.cx, &p("/img/pixel.png"), 0, 10)
        .await
        .unwrap()
    {
        ReadResult::Binary { mime_type, data } => {
            assert_eq!(mime_type, "image/png");
            assert_eq!(data, PNG);
        }
        other => panic!("expected binary, got {other:?}"),
    }
    assert!(matches!(
        h.backend
            .read(&h.cx, &p("/img/latin1.txt"), 0, 10)
            .await
            .unwrap(),
        ReadResult::Binary { .. }
    ));
    assert_eq!(h.text("/img/utf8.txt").await, ["naïve ✓"]);
    assert!(matches!(
        h.edit("/img/pixel.png", "PNG", "JPG", false).await,
        Err(BackendError::Binary { .. })
    ));
    // Binary files never show up in grep.
    assert!(
        h.grep(GrepQuery::literal("PNG", p("/img")))
            .await
            .0
            .is_empty()
    );
    let downloads = h
        .backend
        .download_files(
            &h.cx,
            vec![
                "/img/pixel.png".into(),
                "/img/none.png".into(),
                "/img".into(),
                "relative".into(),
            ],
        )
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
    assert!(matches!(
        h.delete("/notes.txt").await,
        Err(BackendError::NotFound { .. })
    ));
    assert!(h.delete("/").await.is_err(), "the root cannot be deleted");
}
