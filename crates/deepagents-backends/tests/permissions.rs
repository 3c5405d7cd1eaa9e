//! Permission rules and the policy wrapper.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use deepagents_backends::{
    BackendContext, BackendError, BackendOp, BackendPolicy, FileOpError, GrepQuery, Mode,
    Operation, PermissionRule, PermissionedBackend, Permissions, PolicyBackend, ReadOnlyPolicy,
    StateBackend,
};

use crate::conformance::{Harness, p};

fn rule(operations: &[Operation], paths: &[&str], mode: Mode) -> PermissionRule {
    PermissionRule {
        operations: operations.to_vec(),
        paths: paths.iter().map(|s| s.to_string()).collect(),
        mode,
    }
}

async fn seeded(rules: Vec<PermissionRule>) -> Harness {
    let mut plain = Harness::new(Arc::new(StateBackend::default()));
    for path in [
        "/public/a.md",
        "/secrets/key.txt",
        "/secrets/public.md",
        "/src/x.env",
        "/src/main.rs",
    ] {
        plain.write(path, "token\n").await;
    }
    let backend = PermissionedBackend::new(
        Arc::new(StateBackend::default()),
        Permissions::new(rules).unwrap(),
    );
    Harness {
        backend: Arc::new(backend),
        ..plain
    }
}

#[tokio::test]
async fn first_matching_rule_wins_and_no_match_allows() {
    let h = seeded(vec![
        rule(&[Operation::Read], &["/secrets/public.md"], Mode::Allow),
        rule(
            &[Operation::Read, Operation::Write],
            &["/secrets/**"],
            Mode::Deny,
        ),
        rule(&[Operation::Read], &["/**/*.env"], Mode::Deny),
    ])
    .await;
    assert_eq!(h.text("/secrets/public.md").await, ["token"]);
    let error = h
        .backend
        .read(&h.cx, &p("/secrets/key.txt"), 0, 10)
        .await
        .unwrap_err();
    assert!(matches!(error, BackendError::PermissionDenied { .. }));
    assert!(error.to_string().contains("denies reading"), "{error}");
    assert!(
        h.backend
            .read(&h.cx, &p("/src/x.env"), 0, 10)
            .await
            .is_err()
    );
    assert_eq!(h.text("/src/main.rs").await, ["token"]);
}

#[tokio::test]
async fn bulk_results_drop_denied_paths() {
    let h = seeded(vec![
        rule(&[Operation::Read], &["/secrets/**"], Mode::Deny),
        rule(&[Operation::Read], &["/**/*.env"], Mode::Deny),
    ])
    .await;
    assert_eq!(
        h.ls("/secrets").await.unwrap(),
        Vec::<(String, bool)>::new()
    );
    assert_eq!(h.glob("*", "/").await, ["/public/a.md", "/src/main.rs"]);
    let (found, _) = h.grep(GrepQuery::literal("token", p("/"))).await;
    assert_eq!(found, ["/public/a.md:1:token", "/src/main.rs:1:token"]);
    let downloads = h
        .backend
        .download_files(
            &h.cx,
            vec!["/secrets/key.txt".into(), "/public/a.md".into()],
        )
        .await;
    assert_eq!(
        downloads,
        [Err(FileOpError::PermissionDenied), Ok(b"token\n".to_vec())]
    );
}

#[tokio::test]
async fn grep_finds_allowed_matches_behind_denied_ones() {
    let mut plain = Harness::new(Arc::new(StateBackend::default()));
    // Denied matches sort first, so they fill the inner backend's cap.
    for i in 0..10 {
        plain.write(&format!("/a/secret{i}.txt"), "token\n").await;
    }
    plain.write("/b/open.txt", "token\ntoken\n").await;
    let rules = vec![rule(&[Operation::Read], &["/a/**"], Mode::Deny)];
    let h = Harness {
        backend: Arc::new(PermissionedBackend::new(
            Arc::new(StateBackend::default()),
            Permissions::new(rules).unwrap(),
        )),
        ..plain
    };
    let grep = |max_count| GrepQuery {
        max_count,
        ..GrepQuery::literal("token", p("/"))
    };
    let (found, truncated) = h.grep(grep(1)).await;
    assert_eq!(found, ["/b/open.txt:1:token"]);
    assert!(truncated);
    let (found, truncated) = h.grep(grep(2)).await;
    assert_eq!(found, ["/b/open.txt:1:token", "/b/open.txt:2:token"]);
    assert!(!truncated);
    let (found, truncated) = h.grep(grep(1_000)).await;
    assert_eq!(found.len(), 2);
    assert!(!truncated);
}

#[tokio::test]
async fn writes_and_subtree_deletes_respect_deny_rules() {
    let mut h = seeded(vec![
        rule(&[Operation::Write], &["/secrets/key.txt"], Mode::Deny),
        rule(&[Operation::Write], &["/src/**"], Mode::Interrupt),
    ])
    .await;
    for refused in [
        h.try_write("/secrets/key.txt", "x").await,
        h.try_overwrite("/secrets/key.txt", "x").await,
    ] {
        assert!(
            matches!(refused, Err(BackendError::PermissionDenied { .. })),
            "{refused:?}"
        );
    }
    assert!(
        h.edit("/secrets/key.txt", "token", "x", false)
            .await
            .is_err()
    );
    h.write("/secrets/other.txt", "fine").await;
    let error = h.delete("/secrets").await.unwrap_err();
    assert!(error.to_string().contains("/secrets/key.txt"), "{error}");
    assert!(h.delete("/").await.is_err());
    // Interrupt rules are approved before the tool runs; at the backend they allow.
    h.overwrite("/src/main.rs", "changed").await;
    assert_eq!(h.delete("/public").await.unwrap(), 1);
    let answers = h
        .upload(vec![
            ("/secrets/key.txt", b"x".to_vec()),
            ("/public/b.md", b"y".to_vec()),
        ])
        .await;
    assert_eq!(answers, [Err(FileOpError::PermissionDenied), Ok(())]);
}

#[test]
fn rule_paths_must_be_absolute_and_free_of_dot_dot() {
    for bad in ["relative/**", "/a/../b", "/[unclosed"] {
        let error =
            Permissions::new(vec![rule(&[Operation::Read], &[bad], Mode::Deny)]).unwrap_err();
        assert_eq!(error.index, 0);
        assert!(error.to_string().contains(bad), "{error}");
    }
}

#[test]
fn rules_without_operations_or_paths_are_refused() {
    let fine = rule(&[Operation::Read], &["/a/**"], Mode::Deny);
    let error =
        Permissions::new(vec![fine.clone(), rule(&[], &["/secrets/**"], Mode::Deny)]).unwrap_err();
    assert_eq!(error.index, 1);
    assert_eq!(
        error.to_string(),
        "invalid permission rule 1: it lists no operations; give `read`, `write` or both"
    );
    let error =
        Permissions::new(vec![rule(&[Operation::Write], &[], Mode::Deny), fine]).unwrap_err();
    assert_eq!(error.index, 0);
    assert!(error.to_string().contains("no paths"), "{error}");
    let parsed: Vec<PermissionRule> = serde_json::from_value(serde_json::json!([
        {"operations": [], "paths": ["/**"], "mode": "deny"}
    ]))
    .unwrap();
    assert!(Permissions::new(parsed).is_err());
}

#[test]
fn rules_parse_from_toml_like_data() {
    let rules: Vec<PermissionRule> = serde_json::from_value(serde_json::json!([
        {"operations": ["read", "write"], "paths": ["/secrets/**"], "mode": "deny"},
        {"operations": ["write"], "paths": ["/**"], "mode": "interrupt"}
    ]))
    .unwrap();
    let permissions = Permissions::new(rules).unwrap();
    assert_eq!(
        permissions.check(Operation::Read, &p("/secrets/a")),
        Mode::Deny
    );
    assert_eq!(
        permissions.check(Operation::Write, &p("/x")),
        Mode::Interrupt
    );
    assert_eq!(permissions.check(Operation::Read, &p("/x")), Mode::Allow);
}

/// Records every operation and refuses writes of "forbidden".
#[derive(Default)]
struct Audit {
    log: Mutex<Vec<String>>,
}

#[async_trait]
impl BackendPolicy for Audit {
    async fn check(&self, _cx: &BackendContext, op: BackendOp<'_>) -> Result<(), BackendError> {
        if let BackendOp::Write { path, content } = op
            && content.contains("forbidden")
        {
            return Err(BackendError::PermissionDenied {
                path: path.to_string(),
                reason: "content inspection refused it".into(),
            });
        }
        Ok(())
    }

    async fn observe(
        &self,
        _cx: &BackendContext,
        op: BackendOp<'_>,
        outcome: Result<(), &BackendError>,
    ) {
        let name = match op {
            BackendOp::Write { path, .. } => format!("write {path}"),
            BackendOp::Read { path } => format!("read {path}"),
            BackendOp::Upload { path, .. } => format!("upload {path}"),
            _ => "other".to_owned(),
        };
        self.log.lock().unwrap().push(format!(
            "{name} {}",
            if outcome.is_ok() { "ok" } else { "refused" }
        ));
    }
}

/// A read-only mount refuses overwrites and uploads over its files as it refuses writes.
#[tokio::test]
async fn a_read_only_policy_refuses_overwrites() {
    let mut inner = Harness::new(Arc::new(StateBackend::default()));
    inner.write("/notes.md", "kept\n").await;
    let mut h = Harness {
        backend: Arc::new(PolicyBackend::new(
            Arc::new(StateBackend::default()),
            Arc::new(ReadOnlyPolicy::new()),
        )),
        ..inner
    };
    let error = h.try_overwrite("/notes.md", "changed\n").await.unwrap_err();
    assert!(
        matches!(error, BackendError::PermissionDenied { .. }),
        "{error}"
    );
    assert_eq!(
        h.upload(vec![("/notes.md", b"changed\n".to_vec())]).await,
        [Err(FileOpError::PermissionDenied)]
    );
    assert_eq!(h.text("/notes.md").await, ["kept"]);
}

#[tokio::test]
async fn a_policy_wraps_any_backend() {
    let audit = Arc::new(Audit::default());
    let mut h = Harness::new(Arc::new(PolicyBackend::new(
        Arc::new(StateBackend::default()),
        audit.clone(),
    )));
    h.write("/ok.txt", "fine").await;
    let error = h
        .try_write("/bad.txt", "forbidden words")
        .await
        .unwrap_err();
    assert!(error.to_string().contains("content inspection"), "{error}");
    assert_eq!(h.text("/ok.txt").await, ["fine"]);
    assert!(h.backend.read(&h.cx, &p("/missing"), 0, 1).await.is_err());
    h.upload(vec![("/up.bin", vec![0, 1])]).await;
    // An overwrite is a write to a policy: checked and observed as one.
    let error = h
        .try_overwrite("/ok.txt", "forbidden words")
        .await
        .unwrap_err();
    assert!(error.to_string().contains("content inspection"), "{error}");
    h.overwrite("/ok.txt", "finer").await;
    assert_eq!(h.text("/ok.txt").await, ["finer"]);
    assert_eq!(
        *audit.log.lock().unwrap(),
        [
            "write /ok.txt ok",
            "write /bad.txt refused",
            "read /ok.txt ok",
            "read /missing refused",
            "upload /up.bin ok",
            "write /ok.txt refused",
            "write /ok.txt ok",
            "read /ok.txt ok"
        ]
    );
    assert!(h.backend.as_sandbox().is_none());
}
