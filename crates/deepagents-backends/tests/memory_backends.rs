//! The state, store and composite backends: conformance plus their own behaviour.

use std::sync::Arc;

use deepagents_backends::store::{SearchQuery, StoreError};
use deepagents_backends::{
    Backend, BackendContext, BackendError, CompositeBackend, DEFAULT_MAX_FILE_SIZE, FileOpError,
    GrepQuery, InMemoryStore, ReadResult, SqliteStore, StateBackend, Store, StoreBackend,
};
use deepagents_core::{FileContent, FileData, RuntimeContext};
use serde_json::json;

use crate::conformance::{Harness, check_backend, check_mounted, p};

#[tokio::test]
async fn state_backend_conforms() {
    check_backend(Arc::new(StateBackend::default())).await;
}

#[tokio::test]
async fn store_backend_conforms_in_memory() {
    check_backend(Arc::new(StoreBackend::new(Arc::new(InMemoryStore::new())))).await;
}

#[tokio::test]
async fn store_backend_conforms_on_sqlite() {
    let store = SqliteStore::in_memory().await.unwrap();
    check_backend(Arc::new(StoreBackend::new(Arc::new(store)))).await;
}

fn mixed_composite(store: Arc<dyn Store>) -> CompositeBackend {
    CompositeBackend::new(Arc::new(StateBackend::default()))
        .route("/img/", Arc::new(StoreBackend::new(store)))
        .unwrap()
        .route("/archive", Arc::new(StateBackend::default()))
        .unwrap()
}

#[tokio::test]
async fn composite_with_mixed_routes_conforms() {
    check_backend(Arc::new(mixed_composite(Arc::new(InMemoryStore::new())))).await;
}

#[tokio::test]
async fn state_backend_conforms_mounted() {
    check_mounted(Arc::new(StateBackend::default())).await;
}

#[tokio::test]
async fn store_backend_conforms_mounted() {
    check_mounted(Arc::new(StoreBackend::new(Arc::new(InMemoryStore::new())))).await;
}

#[tokio::test]
async fn composite_conforms_mounted_in_a_composite() {
    check_mounted(Arc::new(mixed_composite(Arc::new(InMemoryStore::new())))).await;
}

#[tokio::test]
async fn state_files_are_keyed_by_the_path_the_agent_sees() {
    let mut h = Harness::new(Arc::new(mixed_composite(Arc::new(InMemoryStore::new()))));
    h.write("/archive/old.txt", "kept\n").await;
    h.write("/old.txt", "root\n").await;
    let keys: Vec<_> = h.cx.state.files.keys().cloned().collect();
    assert_eq!(keys, ["/archive/old.txt", "/old.txt"]);
    assert_eq!(h.text("/archive/old.txt").await, ["kept"]);
    assert_eq!(h.text("/old.txt").await, ["root"]);
    assert_eq!(
        h.ls("/archive").await.unwrap(),
        [("/archive/old.txt".into(), false)]
    );
}

#[tokio::test]
async fn state_writes_are_updates_not_mutations() {
    let cx = BackendContext::default();
    let changed = StateBackend::default()
        .write(&cx, &p("/a.txt"), "x")
        .await
        .unwrap();
    assert!(
        cx.state.files.is_empty(),
        "the backend never mutates the state it was given"
    );
    assert!(changed.update.files["/a.txt"].is_some());
    let deleted = {
        let mut h = Harness::new(Arc::new(StateBackend::default()));
        h.write("/a.txt", "x").await;
        StateBackend::default()
            .delete(&h.cx, &p("/a.txt"))
            .await
            .unwrap()
    };
    assert_eq!(
        deleted.update.files["/a.txt"], None,
        "a deletion is a tombstone"
    );
}

/// Checks a backend configured with a 10-byte limit whose storage already holds a 12-byte
/// `/planted.txt`, put there behind the backend's back (as older data or another writer would).
async fn check_size_limit(mut h: Harness) {
    h.write("/exact.txt", "0123456789").await;
    let error = h.try_write("/big.txt", "0123456789A").await.unwrap_err();
    assert_eq!(
        error,
        BackendError::TooLargeToWrite {
            path: "/big.txt".into(),
            size: 11,
            max: 10
        }
    );
    assert!(error.to_string().contains("10-byte"), "{error}");
    assert!(matches!(
        h.read("/big.txt", 0, 1).await,
        Err(BackendError::NotFound { .. })
    ));
    let error = h.edit("/exact.txt", "9", "9AB", false).await.unwrap_err();
    assert!(
        matches!(
            error,
            BackendError::TooLargeToWrite {
                size: 12,
                max: 10,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(h.text("/exact.txt").await, ["0123456789"]);
    assert_eq!(
        h.upload(vec![("/up.bin", vec![1; 11]), ("/ok.bin", vec![1; 10])])
            .await,
        [Err(FileOpError::PermissionDenied), Ok(())]
    );
    assert!(matches!(
        h.read("/up.bin", 0, 1).await,
        Err(BackendError::NotFound { .. })
    ));
    // A file over the limit that got there some other way is not loaded whole, as on disk…
    for error in [
        h.read_raw("/planted.txt").await.unwrap_err(),
        h.edit("/planted.txt", "0", "1", false).await.unwrap_err(),
    ] {
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
    }
    assert_eq!(
        h.download(&["/planted.txt"]).await,
        [Err(FileOpError::PermissionDenied)]
    );
    // …but text is still read page by page, a page holding at most the limit, as on disk: here
    // its one line alone is over it, which the error says…
    let error = h.read("/planted.txt", 0, 1).await.unwrap_err();
    assert!(
        matches!(
            error,
            BackendError::LineTooLong {
                line: 1,
                max: 10,
                ..
            }
        ),
        "{error:?}"
    );
    h.assert_names(&error, "/planted.txt");
    // …and grep still searches it.
    let (found, _) = h.grep(GrepQuery::literal("AB", p("/"))).await;
    assert_eq!(found, ["/planted.txt:1:0123456789AB"]);
}

fn planted() -> FileData {
    FileData {
        content: FileContent::Text {
            text: "0123456789AB".into(),
        },
        modified_at_ms: 0,
        created_at_ms: 0,
    }
}

#[tokio::test]
async fn state_backend_applies_its_size_limit() {
    let mut h = Harness::new(Arc::new(StateBackend::new().with_max_file_size(10)));
    let mut state = (*h.cx.state).clone();
    state.files.insert("/planted.txt".into(), planted());
    h.cx.state = Arc::new(state);
    check_size_limit(h).await;
}

#[tokio::test]
async fn store_backend_applies_its_size_limit() {
    let store = Arc::new(InMemoryStore::new());
    store
        .put(
            &["filesystem".to_owned()],
            "/planted.txt",
            serde_json::to_value(planted()).unwrap(),
        )
        .await
        .unwrap();
    let backend = StoreBackend::new(store).with_max_file_size(10);
    check_size_limit(Harness::new(Arc::new(backend))).await;
}

#[tokio::test]
async fn memory_backends_default_to_the_disk_limit() {
    assert_eq!(StateBackend::default(), StateBackend::new());
    let limit = usize::try_from(DEFAULT_MAX_FILE_SIZE).unwrap();
    let fits = "x".repeat(limit);
    let over = format!("{fits}x");
    let backends: [Arc<dyn Backend>; 2] = [
        Arc::new(StateBackend::default()),
        Arc::new(StoreBackend::new(Arc::new(InMemoryStore::new()))),
    ];
    for backend in backends {
        let name = backend.name();
        let mut h = Harness::new(backend);
        h.write("/fits.txt", &fits).await;
        assert!(
            matches!(
                h.read("/fits.txt", 0, 1).await,
                Ok(ReadResult::Text { total_lines: 1, .. })
            ),
            "{name}"
        );
        let error = h.try_write("/over.txt", &over).await.unwrap_err();
        assert!(
            matches!(error, BackendError::TooLargeToWrite { max, .. } if max == DEFAULT_MAX_FILE_SIZE),
            "{name}: {error:?}"
        );
        assert_eq!(
            h.upload(vec![("/over.bin", over.clone().into_bytes())])
                .await,
            [Err(FileOpError::PermissionDenied)],
            "{name}"
        );
    }
}

#[tokio::test]
async fn size_errors_through_a_composite_name_the_full_path() {
    let composite = CompositeBackend::new(Arc::new(StateBackend::default()))
        .route(
            "/small/",
            Arc::new(StateBackend::new().with_max_file_size(4)),
        )
        .unwrap();
    let mut h = Harness::new(Arc::new(composite));
    h.write("/big.txt", "12345").await;
    let error = h.try_write("/small/big.txt", "12345").await.unwrap_err();
    assert_eq!(
        error,
        BackendError::TooLargeToWrite {
            path: "/small/big.txt".into(),
            size: 5,
            max: 4
        }
    );
}

#[tokio::test]
async fn routes_match_the_longest_prefix_on_segment_boundaries() {
    let memories = Arc::new(InMemoryStore::new());
    let mut h = Harness::new(Arc::new(
        CompositeBackend::new(Arc::new(StateBackend::default()))
            .route(
                "/mem",
                Arc::new(StoreBackend::new(Arc::new(InMemoryStore::new()))),
            )
            .unwrap()
            .route("/memories/", Arc::new(StoreBackend::new(memories.clone())))
            .unwrap()
            .route("/memories/deep", Arc::new(StateBackend::default()))
            .unwrap(),
    ));
    h.write("/memories/x.md", "memory\n").await;
    h.write("/memories/deep/y.md", "deep\n").await;
    h.write("/mem/z.md", "short\n").await;
    let ns = vec!["filesystem".to_owned()];
    assert!(
        memories.get(&ns, "/x.md").await.unwrap().is_some(),
        "stored without its prefix"
    );
    assert!(h.cx.state.files.contains_key("/memories/deep/y.md"));
    assert_eq!(
        h.ls("/").await.unwrap(),
        [("/mem".into(), true), ("/memories".into(), true)]
    );
    assert_eq!(
        h.ls("/memories").await.unwrap(),
        [("/memories/x.md".into(), false)],
        "the deeper mount belongs to its own backend"
    );
    assert_eq!(
        h.glob("*.md", "/").await,
        ["/mem/z.md", "/memories/deep/y.md", "/memories/x.md"]
    );
    assert_eq!(h.glob("memories/*.md", "/").await, ["/memories/x.md"]);
    let error = h.delete("/memories").await.unwrap_err();
    assert!(error.to_string().contains("mount point"), "{error}");
}

#[tokio::test]
async fn composite_grep_applies_one_global_max_count() {
    let mut h = Harness::new(Arc::new(mixed_composite(Arc::new(InMemoryStore::new()))));
    h.write("/a.txt", "x\nx\n").await;
    h.write("/img/b.txt", "x\n").await;
    h.write("/archive/c.txt", "x\n").await;
    let (all, truncated) = h.grep(GrepQuery::literal("x", p("/"))).await;
    assert_eq!(
        all,
        [
            "/a.txt:1:x",
            "/a.txt:2:x",
            "/archive/c.txt:1:x",
            "/img/b.txt:1:x"
        ]
    );
    assert!(!truncated);
    let (some, truncated) = h
        .grep(GrepQuery {
            max_count: 3,
            ..GrepQuery::literal("x", p("/"))
        })
        .await;
    assert_eq!(some.len(), 3);
    assert!(truncated);
    let (included, _) = h
        .grep(GrepQuery {
            include: Some("img/*.txt".into()),
            ..GrepQuery::literal("x", p("/"))
        })
        .await;
    assert_eq!(included, ["/img/b.txt:1:x"]);
}

fn literal(pattern: &str, path: &str, include: Option<&str>, max_count: usize) -> GrepQuery {
    GrepQuery {
        include: include.map(str::to_owned),
        max_count,
        ..GrepQuery::literal(pattern, p(path))
    }
}

#[tokio::test]
async fn composite_grep_filters_each_route_before_its_cap() {
    let mut h = Harness::new(Arc::new(mixed_composite(Arc::new(InMemoryStore::new()))));
    // Excluded files of the route sort before the included ones.
    for i in 0..5 {
        h.write(&format!("/img/a{i}.log"), "x\n").await;
    }
    h.write("/img/sub/deep.txt", "x\n").await;
    h.write("/img/z.txt", "x\n").await;
    h.write("/archive/w.txt", "x\n").await;
    let grep = |include: &str, max_count: usize| literal("x", "/", Some(include), max_count);

    let (found, truncated) = h.grep(grep("img/*.txt", 2)).await;
    assert_eq!(found, ["/img/z.txt:1:x"], "anchored: not img/sub/deep.txt");
    assert!(!truncated);
    let (found, _) = h.grep(grep("/img/**/*.txt", 2)).await;
    assert_eq!(found, ["/img/sub/deep.txt:1:x", "/img/z.txt:1:x"]);
    let (found, truncated) = h.grep(grep("*.txt", 2)).await;
    assert_eq!(
        found,
        ["/archive/w.txt:1:x", "/img/sub/deep.txt:1:x"],
        "a name pattern matches at any depth of every route"
    );
    assert!(truncated);
    let (found, truncated) = h.grep(grep("*.txt", 3)).await;
    assert_eq!(
        found,
        [
            "/archive/w.txt:1:x",
            "/img/sub/deep.txt:1:x",
            "/img/z.txt:1:x"
        ]
    );
    assert!(!truncated);
    let (found, _) = h.grep(grep("*/z.txt", 1)).await;
    assert_eq!(found, ["/img/z.txt:1:x"], "a wildcard above the mount");
    let (found, _) = h.grep(grep("**/sub/*.txt", 1)).await;
    assert_eq!(found, ["/img/sub/deep.txt:1:x"]);
    let (found, _) = h.grep(grep("{img,archive}/*.txt", 5)).await;
    assert_eq!(found, ["/archive/w.txt:1:x", "/img/z.txt:1:x"]);
    let (found, _) = h.grep(grep("archive/*.log", 5)).await;
    assert!(found.is_empty(), "{found:?}");
    for mount_point in ["img", "/img/"] {
        let (found, _) = h.grep(grep(mount_point, 5)).await;
        assert!(
            found.is_empty(),
            "the mount point is a directory: {found:?}"
        );
    }
}

#[tokio::test]
async fn composite_grep_hides_default_files_under_mounts_before_the_cap() {
    // The default backend holds files under a mount point, which the mount hides; they sort
    // before the visible match and must not use up the cap.
    let mut plain = Harness::new(Arc::new(StateBackend::default()));
    for i in 0..5 {
        plain.write(&format!("/img/hidden{i}.txt"), "x\n").await;
    }
    plain.write("/z.txt", "x\n").await;
    let h = Harness {
        backend: Arc::new(mixed_composite(Arc::new(InMemoryStore::new()))),
        ..plain
    };
    let (found, truncated) = h.grep(literal("x", "/", None, 1)).await;
    assert_eq!(found, ["/z.txt:1:x"]);
    assert!(!truncated);
    assert_eq!(h.glob("*.txt", "/").await, ["/z.txt"]);
}

#[tokio::test]
async fn composite_grep_honours_the_cap_of_one_route_with_its_truncation() {
    let mut h = Harness::new(Arc::new(mixed_composite(Arc::new(InMemoryStore::new()))));
    h.write("/img/a.txt", "x\nx\nx\n").await;
    let (found, truncated) = h.grep(literal("x", "/", None, 2)).await;
    assert_eq!(found, ["/img/a.txt:1:x", "/img/a.txt:2:x"]);
    assert!(truncated, "the route stopped at the cap");
    let (found, truncated) = h.grep(literal("x", "/", None, 3)).await;
    assert_eq!(found.len(), 3);
    assert!(!truncated);
}

#[tokio::test]
async fn routed_errors_name_the_path_the_agent_used() {
    let mut h = Harness::new(Arc::new(mixed_composite_memories(Arc::new(
        InMemoryStore::new(),
    ))));
    let missing = h.read("/memories/x.md", 0, 10).await.unwrap_err();
    assert_eq!(
        missing.to_string(),
        "/memories/x.md does not exist; check the path with ls or glob"
    );
    h.write("/memories/a.md", "one one\n").await;
    let twice = h
        .edit("/memories/a.md", "one", "1", false)
        .await
        .unwrap_err();
    assert!(
        twice.to_string().contains("2 times in /memories/a.md;"),
        "{twice}"
    );
    let not_dir = h.ls("/memories/a.md").await.unwrap_err();
    assert_eq!(not_dir.to_string(), "/memories/a.md is not a directory");
    let under_file = h.try_write("/memories/a.md/b.md", "x").await.unwrap_err();
    assert_eq!(under_file.to_string(), "/memories/a.md is not a directory");
    let grep_missing = h
        .try_grep(GrepQuery::literal("one", p("/memories/none")))
        .await
        .unwrap_err();
    h.assert_names(&grep_missing, "/memories/none");
    let delete_missing = h.delete("/memories/none").await.unwrap_err();
    h.assert_names(&delete_missing, "/memories/none");
}

#[tokio::test]
async fn composite_uploads_split_per_route_and_answer_in_order() {
    let mut h = Harness::new(Arc::new(mixed_composite(Arc::new(InMemoryStore::new()))));
    let answers = h
        .upload(vec![
            ("/img/1.txt", b"1".to_vec()),
            ("/2.txt", b"2".to_vec()),
            ("bad", b"3".to_vec()),
            ("/archive/4.txt", b"4".to_vec()),
        ])
        .await;
    assert_eq!(
        answers,
        [
            Ok(()),
            Ok(()),
            Err(deepagents_backends::FileOpError::InvalidPath),
            Ok(())
        ]
    );
    let downloads = h
        .backend
        .download_files(
            &h.cx,
            vec![
                "/archive/4.txt".into(),
                "/img/1.txt".into(),
                "/2.txt".into(),
            ],
        )
        .await;
    assert_eq!(
        downloads,
        [Ok(b"4".to_vec()), Ok(b"1".to_vec()), Ok(b"2".to_vec())]
    );
    assert!(
        h.backend.as_sandbox().is_none(),
        "execute goes to the default, which has none"
    );
}

#[tokio::test]
async fn long_term_memory_outlives_the_thread() {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::in_memory().await.unwrap());
    let backend = || -> Arc<dyn Backend> { Arc::new(mixed_composite_memories(store.clone())) };
    let mut thread_a = Harness::new(backend());
    thread_a.cx.thread_id = Some("a".into());
    thread_a.write("/memories/user.md", "prefers tabs\n").await;
    thread_a.write("/scratch.md", "thread a only\n").await;

    let mut thread_b = Harness::new(backend());
    thread_b.cx.thread_id = Some("b".into());
    assert_eq!(thread_b.text("/memories/user.md").await, ["prefers tabs"]);
    assert!(matches!(
        thread_b
            .backend
            .read(&thread_b.cx, &p("/scratch.md"), 0, 10)
            .await,
        Err(BackendError::NotFound { .. })
    ));
}

fn mixed_composite_memories(store: Arc<dyn Store>) -> CompositeBackend {
    CompositeBackend::new(Arc::new(StateBackend::default()))
        .route("/memories/", Arc::new(StoreBackend::new(store)))
        .unwrap()
}

#[tokio::test]
async fn store_namespaces_come_from_the_runtime_context() {
    let store = Arc::new(InMemoryStore::new());
    let backend = StoreBackend::new(store.clone()).with_namespace(|cx| {
        let user = cx.runtime.get::<String>().cloned().unwrap_or_default();
        vec!["users".into(), user, "files".into()]
    });
    let alice = BackendContext {
        runtime: RuntimeContext::new("alice@example.com".to_owned()),
        ..BackendContext::default()
    };
    backend.write(&alice, &p("/a.md"), "hi").await.unwrap();
    let ns: Vec<String> = ["users", "alice@example.com", "files"]
        .map(String::from)
        .to_vec();
    assert!(store.get(&ns, "/a.md").await.unwrap().is_some());

    let bob = BackendContext {
        runtime: RuntimeContext::new("bob".to_owned()),
        ..BackendContext::default()
    };
    assert!(matches!(
        backend.read(&bob, &p("/a.md"), 0, 10).await,
        Err(BackendError::NotFound { .. })
    ));
    let sneaky = BackendContext {
        runtime: RuntimeContext::new("*".to_owned()),
        ..BackendContext::default()
    };
    let error = backend.read(&sneaky, &p("/a.md"), 0, 10).await.unwrap_err();
    assert!(error.to_string().contains("`*` is not allowed"), "{error}");
    let nobody = BackendContext::default();
    let error = backend.ls(&nobody, &p("/")).await.unwrap_err();
    assert!(error.to_string().contains("must not be empty"), "{error}");
}

/// The store conformance: namespaces, component-wise prefix search, pagination, deletes and
/// namespace validation. Shared by every [`Store`] implementation's tests.
pub async fn exercise_store(store: &dyn Store) {
    let ns = |parts: &[&str]| parts.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    store.put(&ns(&["a"]), "k1", json!(1)).await.unwrap();
    store.put(&ns(&["a"]), "k2", json!(2)).await.unwrap();
    store
        .put(&ns(&["a", "b"]), "k1", json!({"x": true}))
        .await
        .unwrap();
    store
        .put(&ns(&["a_b"]), "k1", json!("other"))
        .await
        .unwrap();
    // Beside `a` in byte order, not under it.
    for beside in ["a-b", "a.b", "a+b", "a0", "a:b"] {
        store
            .put(&ns(&[beside]), "k1", json!(beside))
            .await
            .unwrap();
    }
    store.put(&ns(&["a"]), "k1", json!(10)).await.unwrap();
    let item = store.get(&ns(&["a"]), "k1").await.unwrap().unwrap();
    assert_eq!(item.value, json!(10));
    assert!(item.updated_at_ms >= item.created_at_ms);
    let under_a = store
        .search(&ns(&["a"]), &SearchQuery::default())
        .await
        .unwrap();
    let found: Vec<_> = under_a
        .iter()
        .map(|i| (i.namespace.join("/"), i.key.clone()))
        .collect();
    assert_eq!(
        found,
        [
            ("a".into(), "k1".into()),
            ("a".into(), "k2".into()),
            ("a/b".into(), "k1".into())
        ],
        "component-wise prefix: a_b, a-b, a.b, a+b, a0, a:b are not under a"
    );
    let page = store
        .search(
            &ns(&["a"]),
            &SearchQuery {
                key_prefix: "k".into(),
                offset: 1,
                limit: 1,
            },
        )
        .await
        .unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].key, "k2");
    let prefixed = store
        .search(
            &ns(&["a"]),
            &SearchQuery {
                key_prefix: "k2".into(),
                ..SearchQuery::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(prefixed.len(), 1);
    assert!(store.delete(&ns(&["a"]), "k2").await.unwrap());
    assert!(!store.delete(&ns(&["a"]), "k2").await.unwrap());
    assert!(store.get(&ns(&["a"]), "k2").await.unwrap().is_none());
    for bad in [
        ns(&[]),
        ns(&["ok", ""]),
        ns(&["a/b"]),
        ns(&["a*"]),
        ns(&["sp ace"]),
    ] {
        assert!(
            matches!(
                store.put(&bad, "k", json!(0)).await,
                Err(StoreError::InvalidNamespace { .. })
            ),
            "{bad:?} accepted"
        );
    }
}

/// Merges are JSON merge patches (RFC 7396): fields set and removed, objects merged field by
/// field, the rest of the item kept; a missing item stays missing.
pub async fn exercise_merge(store: &dyn Store) {
    let ns = ["m".to_owned()];
    let doc = json!({"status": "idle", "meta": {"a": 1, "b": 2}, "gone": true, "n": 1});
    store.put(&ns, "doc", doc).await.unwrap();
    let patch = json!({"status": "busy", "meta": {"b": null, "c": 3}, "gone": null});
    let merged = store.merge(&ns, "doc", &patch).await.unwrap().unwrap();
    let expected = json!({"status": "busy", "meta": {"a": 1, "c": 3}, "n": 1});
    assert_eq!(merged.value, expected);
    assert_eq!(
        store.get(&ns, "doc").await.unwrap().unwrap().value,
        expected
    );
    let flat = json!({"status": "idle", "at": "now", "list": [1, 2]});
    let merged = store.merge(&ns, "doc", &flat).await.unwrap().unwrap();
    assert_eq!(
        merged.value,
        json!({"status": "idle", "meta": {"a": 1, "c": 3}, "n": 1, "at": "now", "list": [1, 2]})
    );
    assert_eq!(merged.key, "doc");
    assert_eq!(merged.namespace, ns);
    store.put(&ns, "number", json!(5)).await.unwrap();
    let merged = store.merge(&ns, "number", &json!({"x": 1})).await.unwrap();
    assert_eq!(merged.unwrap().value, json!({"x": 1}));
    assert!(
        store
            .merge(&ns, "missing", &json!({"x": 1}))
            .await
            .unwrap()
            .is_none()
    );
    assert!(store.get(&ns, "missing").await.unwrap().is_none());
}

/// Concurrent merges of one item each keep the others' fields: none reads a value another
/// is about to replace.
pub async fn concurrent_merges_all_land(store: Arc<dyn Store>) {
    let ns = ["race".to_owned()];
    store.put(&ns, "doc", json!({})).await.unwrap();
    let merges = (0..24).map(|i| {
        let store = Arc::clone(&store);
        let ns = ns.clone();
        tokio::spawn(async move {
            let patch = json!({ format!("f{i}"): i });
            store.merge(&ns, "doc", &patch).await.unwrap();
        })
    });
    for merge in futures::future::join_all(merges).await {
        merge.unwrap();
    }
    let value = store.get(&ns, "doc").await.unwrap().unwrap().value;
    assert_eq!(value.as_object().unwrap().len(), 24, "{value}");
}

/// A store that only implements the required methods: the default merge.
struct Plain(InMemoryStore);

#[async_trait::async_trait]
impl Store for Plain {
    async fn get(
        &self,
        namespace: &[String],
        key: &str,
    ) -> Result<Option<deepagents_backends::store::StoreItem>, StoreError> {
        self.0.get(namespace, key).await
    }
    async fn put(
        &self,
        namespace: &[String],
        key: &str,
        value: serde_json::Value,
    ) -> Result<(), StoreError> {
        self.0.put(namespace, key, value).await
    }
    async fn delete(&self, namespace: &[String], key: &str) -> Result<bool, StoreError> {
        self.0.delete(namespace, key).await
    }
    async fn search(
        &self,
        namespace_prefix: &[String],
        query: &SearchQuery,
    ) -> Result<Vec<deepagents_backends::store::StoreItem>, StoreError> {
        self.0.search(namespace_prefix, query).await
    }
}

#[tokio::test]
async fn in_memory_store_namespaces_and_search() {
    exercise_store(&InMemoryStore::new()).await;
    exercise_merge(&InMemoryStore::new()).await;
    exercise_merge(&Plain(InMemoryStore::new())).await;
    concurrent_merges_all_land(Arc::new(InMemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_namespaces_search_and_persistence() {
    exercise_store(&SqliteStore::in_memory().await.unwrap()).await;
    exercise_merge(&SqliteStore::in_memory().await.unwrap()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    {
        let store = SqliteStore::open(&path).await.unwrap();
        store
            .put(&["n".to_owned()], "k", json!("kept"))
            .await
            .unwrap();
    }
    let reopened = SqliteStore::open(&path).await.unwrap();
    let item = reopened.get(&["n".to_owned()], "k").await.unwrap().unwrap();
    assert_eq!(item.value, json!("kept"));
    concurrent_merges_all_land(Arc::new(reopened)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_openers_of_one_sqlite_store_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let opens = (0..8).map(|i| {
        let path = path.clone();
        tokio::spawn(async move {
            let store = SqliteStore::open(&path).await?;
            store
                .put(&["n".to_owned()], &format!("k{i}"), json!(i))
                .await?;
            Ok::<_, StoreError>(())
        })
    });
    for open in futures::future::join_all(opens).await {
        open.unwrap().unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    let all = store
        .search(&["n".to_owned()], &SearchQuery::default())
        .await
        .unwrap();
    assert_eq!(all.len(), 8);
}

/// The state backend edits text that is not UTF-8 byte-wise, as the disk backend does: the
/// bytes an edit does not replace are kept, and a file whose last invalid bytes are replaced
/// becomes a string again.
#[tokio::test]
async fn state_edits_of_non_utf8_text_keep_every_other_byte() {
    let mut h = Harness::new(Arc::new(StateBackend::default()));
    let answers = h
        .upload(vec![(
            "/menu.txt",
            b"caf\xe9 cr\xe8me\nneedle here\n".to_vec(),
        )])
        .await;
    assert_eq!(answers, [Ok(())]);
    let count = h
        .edit(
            "/menu.txt",
            "caf\u{FFFD} cr\u{FFFD}me",
            "caf\u{FFFD} cr\u{FFFD}me!",
            false,
        )
        .await
        .unwrap();
    assert_eq!(count, 1);
    assert_eq!(
        h.read_raw("/menu.txt").await.unwrap().data,
        b"caf\xe9 cr\xe8me!\nneedle here\n"
    );
    h.edit(
        "/menu.txt",
        "caf\u{FFFD} cr\u{FFFD}me",
        "caf\u{E9} cr\u{E8}me",
        false,
    )
    .await
    .unwrap();
    assert_eq!(
        h.cx.state.files["/menu.txt"].content,
        FileContent::Text {
            text: "caf\u{E9} cr\u{E8}me!\nneedle here\n".into()
        }
    );
}

/// A file keeps the time it was first written through overwrites and edits; its modification
/// time moves on.
#[tokio::test]
async fn files_carry_their_creation_and_modification_times() {
    let items = Arc::new(InMemoryStore::new());
    let store = StoreBackend::new(items.clone());
    let cx_store = BackendContext::default();
    let path = p("/notes.txt");
    let state_backend = StateBackend::default();
    let mut state = deepagents_core::AgentState::default();
    let schema = deepagents_core::StateSchema::default();
    let apply = |state: &mut deepagents_core::AgentState, update| {
        schema.apply_all(state, [update]).unwrap();
    };
    let cx =
        |state: &deepagents_core::AgentState| BackendContext::with_state(Arc::new(state.clone()));

    let written = state_backend
        .write(&cx(&state), &path, "one\n")
        .await
        .unwrap();
    apply(&mut state, written.update);
    store.write(&cx_store, &path, "one\n").await.unwrap();
    let first = state.files["/notes.txt"].clone();
    assert_eq!(first.created_at_ms, first.modified_at_ms);
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;

    let edited = state_backend
        .edit(&cx(&state), &path, "one", "two", false)
        .await
        .unwrap();
    apply(&mut state, edited.update);
    let refused = state_backend.write(&cx(&state), &path, "three\n").await;
    assert!(
        matches!(refused, Err(BackendError::AlreadyExists { .. })),
        "{refused:?}"
    );
    let rewritten = state_backend
        .overwrite(&cx(&state), &path, "three\n")
        .await
        .unwrap();
    apply(&mut state, rewritten.update);
    let last = &state.files["/notes.txt"];
    assert_eq!(last.created_at_ms, first.created_at_ms, "created once");
    assert!(last.modified_at_ms > first.modified_at_ms, "modified later");

    store
        .edit(&cx_store, &path, "one", "two", false)
        .await
        .unwrap();
    let stored = store
        .download_files(&cx_store, vec!["/notes.txt".into()])
        .await;
    assert_eq!(stored[0].as_deref(), Ok(&b"two\n"[..]));
    let stored_file = || async {
        let item = items
            .get(&["filesystem".to_owned()], "/notes.txt")
            .await
            .unwrap()
            .unwrap();
        serde_json::from_value::<FileData>(item.value).unwrap()
    };
    let store_created = stored_file().await.created_at_ms;
    let refused = store.write(&cx_store, &path, "three\n").await;
    assert!(
        matches!(refused, Err(BackendError::AlreadyExists { .. })),
        "{refused:?}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    store.overwrite(&cx_store, &path, "three\n").await.unwrap();
    let replaced = stored_file().await;
    assert_eq!(replaced.created_at_ms, store_created, "created once");
    assert!(replaced.modified_at_ms > store_created, "modified later");
    assert_eq!(
        replaced.content,
        FileContent::Text {
            text: "three\n".into()
        }
    );
}

/// A backend written against the core protocol only — name, ls, read, write, edit, glob,
/// grep — with the defaults for the rest, as a user would write one.
mod core_only {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;
    use deepagents_backends::memory::{MemoryTree, file_data, now_ms};
    use deepagents_backends::{
        Backend, BackendContext, BackendError, Changed, FileInfo, FileOpError, GlobResult,
        GrepQuery, GrepResult, ReadResult, StateBackend, VPath,
    };
    use deepagents_core::FileData;

    use crate::conformance::Harness;

    #[derive(Default)]
    pub struct MapBackend(Mutex<BTreeMap<VPath, FileData>>);

    impl MapBackend {
        fn tree(&self) -> MemoryTree<FileData> {
            MemoryTree::new(self.0.lock().unwrap().clone())
        }
    }

    #[async_trait]
    impl Backend for MapBackend {
        fn name(&self) -> &'static str {
            "map"
        }

        async fn ls(
            &self,
            _: &BackendContext,
            path: &VPath,
        ) -> Result<Vec<FileInfo>, BackendError> {
            self.tree().ls(path)
        }

        async fn read(
            &self,
            _: &BackendContext,
            path: &VPath,
            offset: usize,
            limit: usize,
        ) -> Result<ReadResult, BackendError> {
            self.tree().read(path, offset, limit)
        }

        async fn write(
            &self,
            _: &BackendContext,
            path: &VPath,
            content: &str,
        ) -> Result<Changed<()>, BackendError> {
            // Create-only, as the protocol says: an existing file is AlreadyExists.
            self.tree().check_create(path, content.len())?;
            let file = file_data(path, content.as_bytes().to_vec(), now_ms());
            self.0.lock().unwrap().insert(path.clone(), file);
            Ok(Changed::outside_state(()))
        }

        async fn edit(
            &self,
            _: &BackendContext,
            path: &VPath,
            old: &str,
            new: &str,
            replace_all: bool,
        ) -> Result<Changed<usize>, BackendError> {
            let (content, count) = self.tree().edit_content(path, old, new, replace_all)?;
            let file = FileData {
                content,
                modified_at_ms: now_ms(),
                created_at_ms: 0,
            };
            self.0.lock().unwrap().insert(path.clone(), file);
            Ok(Changed::outside_state(count))
        }

        async fn glob(
            &self,
            _: &BackendContext,
            pattern: &str,
            base: &VPath,
        ) -> Result<GlobResult, BackendError> {
            self.tree().glob(pattern, base)
        }

        async fn grep(
            &self,
            _: &BackendContext,
            query: &GrepQuery,
        ) -> Result<GrepResult, BackendError> {
            self.tree().grep(query)
        }
    }

    #[tokio::test]
    async fn a_backend_of_only_the_core_methods_passes_the_core_suite() {
        deepagents_backends::testing::check_core_backend(Arc::new(MapBackend::default())).await;
        let backend = MapBackend::default();
        let cx = BackendContext::default();
        let deleted = backend.delete(&cx, &VPath::parse("/x").unwrap()).await;
        assert!(
            matches!(
                deleted,
                Err(BackendError::Unsupported {
                    operation: "delete",
                    ..
                })
            ),
            "{deleted:?}"
        );
    }

    /// Without delete, the default overwrite (and an upload over a file) cannot replace an
    /// existing file: it says delete is missing and changes nothing.
    #[tokio::test]
    async fn without_delete_the_default_overwrite_fails_and_changes_nothing() {
        let mut h = Harness::new(Arc::new(MapBackend::default()));
        h.write("/a.txt", "before\n").await;
        let error = h.try_overwrite("/a.txt", "after\n").await.unwrap_err();
        assert!(
            matches!(
                error,
                BackendError::Unsupported {
                    operation: "delete",
                    ..
                }
            ),
            "{error}"
        );
        assert_eq!(
            h.upload(vec![("/a.txt", b"after\n".to_vec())]).await,
            [Err(FileOpError::PermissionDenied)]
        );
        assert_eq!(h.text("/a.txt").await, ["before"]);
        h.overwrite("/b.txt", "new\n").await;
        assert_eq!(
            h.text("/b.txt").await,
            ["new"],
            "a new file is simply written"
        );
    }

    /// The core and delete over the state backend, with the defaults for the rest: the
    /// default overwrite deletes then writes, the write seeing the delete though the state
    /// only changes when the run merges the updates.
    struct StateCore(StateBackend);

    #[async_trait]
    impl Backend for StateCore {
        fn name(&self) -> &'static str {
            "state-core"
        }

        async fn ls(
            &self,
            cx: &BackendContext,
            path: &VPath,
        ) -> Result<Vec<FileInfo>, BackendError> {
            self.0.ls(cx, path).await
        }

        async fn read(
            &self,
            cx: &BackendContext,
            path: &VPath,
            offset: usize,
            limit: usize,
        ) -> Result<ReadResult, BackendError> {
            self.0.read(cx, path, offset, limit).await
        }

        async fn write(
            &self,
            cx: &BackendContext,
            path: &VPath,
            content: &str,
        ) -> Result<Changed<()>, BackendError> {
            self.0.write(cx, path, content).await
        }

        async fn edit(
            &self,
            cx: &BackendContext,
            path: &VPath,
            old: &str,
            new: &str,
            replace_all: bool,
        ) -> Result<Changed<usize>, BackendError> {
            self.0.edit(cx, path, old, new, replace_all).await
        }

        async fn delete(
            &self,
            cx: &BackendContext,
            path: &VPath,
        ) -> Result<Changed<usize>, BackendError> {
            self.0.delete(cx, path).await
        }

        async fn glob(
            &self,
            cx: &BackendContext,
            pattern: &str,
            base: &VPath,
        ) -> Result<GlobResult, BackendError> {
            self.0.glob(cx, pattern, base).await
        }

        async fn grep(
            &self,
            cx: &BackendContext,
            query: &GrepQuery,
        ) -> Result<GrepResult, BackendError> {
            self.0.grep(cx, query).await
        }
    }

    #[tokio::test]
    async fn the_default_overwrite_deletes_then_writes() {
        deepagents_backends::testing::check_core_backend(Arc::new(StateCore(
            StateBackend::default(),
        )))
        .await;
        let mut h = Harness::new(Arc::new(StateCore(StateBackend::default())));
        h.write("/a.txt", "before\n").await;
        h.overwrite("/a.txt", "after\n").await;
        assert_eq!(h.text("/a.txt").await, ["after"]);
        assert_eq!(
            h.upload(vec![("/a.txt", b"uploaded\n".to_vec())]).await,
            [Ok(())]
        );
        assert_eq!(h.text("/a.txt").await, ["uploaded"]);
        assert_eq!(h.ls("/").await.unwrap(), [("/a.txt".to_owned(), false)]);
    }
}

/// Keys and namespace components every store can hold: a NUL, an empty key or one longer
/// than an index row are refused alike, as invalid input, never as a storage failure; values
/// holding NUL are kept.
pub(crate) async fn refuse_unstorable_addresses(store: &dyn Store) {
    let ns = vec!["users".to_owned()];
    for key in [
        "",
        "a\0b",
        &"k".repeat(deepagents_backends::store::MAX_KEY_LEN + 1),
    ] {
        let error = store.put(&ns, key, json!(1)).await.unwrap_err();
        assert!(matches!(error, StoreError::InvalidKey { .. }), "{error}");
        let error = store.get(&ns, key).await.unwrap_err();
        assert!(matches!(error, StoreError::InvalidKey { .. }), "{error}");
    }
    let long = vec!["x".repeat(deepagents_backends::store::MAX_KEY_LEN + 1)];
    let error = store.put(&long, "k", json!(1)).await.unwrap_err();
    assert!(
        matches!(error, StoreError::InvalidNamespace { .. }),
        "{error}"
    );
    let longest = "k".repeat(deepagents_backends::store::MAX_KEY_LEN);
    store
        .put(&ns, &longest, json!("nul \u{0} inside"))
        .await
        .unwrap();
    let item = store.get(&ns, &longest).await.unwrap().unwrap();
    assert_eq!(item.value, json!("nul \u{0} inside"));
}

#[tokio::test]
async fn stores_refuse_keys_they_could_not_hold() {
    refuse_unstorable_addresses(&InMemoryStore::new()).await;
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(dir.path().join("data.db")).await.unwrap();
    refuse_unstorable_addresses(&sqlite).await;
}
