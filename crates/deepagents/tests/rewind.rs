//! Rewind: snapshots before each user turn, and rewinding files and conversation to them.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;

use deepagents::backends::{Backend, FilesystemBackend, LocalShellBackend};
use deepagents::rewind::{RewindError, RewindOptions, Snapshots, next_turn};
use deepagents::{Agent, InMemoryCheckpointer, Thread};
use serde_json::{Value, json};

use crate::support::scripted;

/// Every file, link and directory under `root` (`.git` aside): bytes and mode, link
/// targets, directory modes.
fn tree(root: &Path) -> BTreeMap<String, (String, Vec<u8>, u32)> {
    let mut out = BTreeMap::new();
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (String, Vec<u8>, u32)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let name = path
                .strip_prefix(root)
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode() & 0o7777;
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(name, ("link".into(), target.to_str().unwrap().into(), 0));
            } else if meta.is_dir() {
                out.insert(name, ("dir".into(), Vec::new(), mode));
                walk(root, &path, out);
            } else {
                out.insert(name, ("file".into(), std::fs::read(&path).unwrap(), mode));
            }
        }
    }
    walk(root, root, &mut out);
    out
}

fn agent(steps: Vec<Value>, backend: Arc<dyn Backend>) -> Agent {
    let mut turns = Vec::new();
    for step in steps {
        if step.as_array().unwrap().is_empty() {
            turns.push(json!({ "text": "done" }));
            continue;
        }
        let calls: Vec<Value> = step
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, call)| {
                let mut call = call.clone();
                call["id"] = json!(format!("c{i}-{}", turns.len()));
                call
            })
            .collect();
        turns.push(json!({ "tool_calls": calls }));
        turns.push(json!({ "text": "done" }));
    }
    Agent::builder(scripted(Value::Array(turns)))
        .backend(backend)
        .checkpointer(Arc::new(InMemoryCheckpointer::new()))
        .build()
        .unwrap()
}

/// One user turn as a front end runs it: snapshot, run, record what it left.
async fn turn(snapshots: &Snapshots, thread: &Thread, root: Option<&Path>, text: &str) -> u64 {
    let state = thread.state().await.unwrap();
    let n = next_turn(state.as_ref());
    let files = state.map(|run| run.state.files).unwrap_or_default();
    snapshots
        .record(thread.id(), n, text, root, &files)
        .unwrap();
    thread.run(text).await.unwrap();
    let state = thread.state().await.unwrap().unwrap();
    snapshots
        .record_after(thread.id(), n, root, &state.state.files)
        .unwrap();
    n
}

const FILES_ONLY: RewindOptions = RewindOptions {
    files: true,
    conversation: false,
    force: false,
};

#[tokio::test]
async fn rewinding_write_file_turns_restores_the_tree_and_the_conversation() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let snapshots = Snapshots::new(data.path());
    std::fs::write(root.path().join("a.txt"), "one\n").unwrap();
    std::fs::write(root.path().join("run.sh"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(
        root.path().join("run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let agent = agent(
        vec![
            json!([
                {"name": "write_file", "args": {"file_path": "/new/made.txt", "content": "made\n"}},
                {"name": "edit_file", "args": {"file_path": "/a.txt", "old_string": "one", "new_string": "two"}}
            ]),
            json!([
                {"name": "write_file", "args": {"file_path": "/b.txt", "content": "bee\n"}},
                {"name": "edit_file", "args": {"file_path": "/a.txt", "old_string": "two", "new_string": "three"}}
            ]),
            json!([]),
        ],
        Arc::new(FilesystemBackend::new(root.path()).unwrap()),
    );
    let thread = agent.thread("t1").unwrap();
    let before_1 = tree(root.path());
    assert_eq!(
        turn(&snapshots, &thread, Some(root.path()), "first").await,
        1
    );
    let before_2 = tree(root.path());
    assert_eq!(
        turn(&snapshots, &thread, Some(root.path()), "second").await,
        2
    );
    assert_eq!(
        std::fs::read_to_string(root.path().join("a.txt")).unwrap(),
        "three\n"
    );
    let checkpointer = agent.checkpointer().unwrap().as_ref();

    // Files only: the conversation stays.
    let report = snapshots
        .rewind(checkpointer, "t1", 2, Some(root.path()), FILES_ONLY)
        .await
        .unwrap();
    assert_eq!(tree(root.path()), before_2);
    assert_eq!(report.restored, ["a.txt"]);
    assert_eq!(report.removed, ["b.txt"]);
    assert!(report.conversation.is_none());
    assert_eq!(next_turn(thread.state().await.unwrap().as_ref()), 3);

    // Both, to the first turn: the files as they were, the conversation empty.
    let report = snapshots
        .rewind(
            checkpointer,
            "t1",
            1,
            Some(root.path()),
            RewindOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(tree(root.path()), before_1);
    assert_eq!(report.removed, ["new", "new/made.txt"]);
    assert_eq!(report.conversation, Some((0, 10)));
    assert!(
        report
            .lines()
            .iter()
            .any(|l| l.starts_with("conversation:"))
    );
    let state = thread.state().await.unwrap().unwrap();
    assert!(state.state.messages.is_empty());
    // Later snapshots belonged to the abandoned history.
    let listed: Vec<u64> = snapshots
        .list("t1")
        .unwrap()
        .iter()
        .map(|s| s.turn)
        .collect();
    assert_eq!(listed, [1]);
    // The thread goes on from there: its next turn is turn 1 again.
    assert_eq!(
        turn(&snapshots, &thread, Some(root.path()), "again").await,
        1
    );
    let messages = thread.state().await.unwrap().unwrap().state.messages;
    assert_eq!(messages[0].text(), "again");
}

#[tokio::test]
async fn rewinding_the_conversation_only_leaves_the_files() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let snapshots = Snapshots::new(data.path());
    let agent = agent(
        vec![
            json!([{"name": "write_file", "args": {"file_path": "/x.txt", "content": "x"}}]),
            json!([{"name": "write_file", "args": {"file_path": "/y.txt", "content": "y"}}]),
        ],
        Arc::new(FilesystemBackend::new(root.path()).unwrap()),
    );
    let thread = agent.thread("t2").unwrap();
    turn(&snapshots, &thread, Some(root.path()), "first").await;
    let after_1 = thread.state().await.unwrap().unwrap().state.messages.len();
    turn(&snapshots, &thread, Some(root.path()), "second").await;
    let files = tree(root.path());
    let report = snapshots
        .rewind(
            agent.checkpointer().unwrap().as_ref(),
            "t2",
            2,
            Some(root.path()),
            RewindOptions {
                files: false,
                conversation: true,
                force: false,
            },
        )
        .await
        .unwrap();
    assert!(report.files_unchanged());
    assert_eq!(tree(root.path()), files);
    let messages = thread.state().await.unwrap().unwrap().state.messages;
    assert_eq!(messages.len(), after_1);
    assert_eq!(messages[0].text(), "first");
    // A turn the conversation does not have is refused.
    let missing = snapshots
        .rewind(
            agent.checkpointer().unwrap().as_ref(),
            "t2",
            5,
            Some(root.path()),
            RewindOptions::default(),
        )
        .await;
    assert!(
        matches!(missing, Err(RewindError::NoTurn { turns: 1, .. })),
        "{missing:?}"
    );
}

#[tokio::test]
async fn rewinding_execute_turns_restores_changed_created_and_deleted_files() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let snapshots = Snapshots::new(data.path());
    let r = root.path();
    std::fs::write(r.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(r.join("gone.txt"), "to be deleted\n").unwrap();
    std::fs::write(r.join("keep.sh"), "echo hi\n").unwrap();
    std::fs::set_permissions(r.join("keep.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(r.join("sub/empty")).unwrap();
    std::os::unix::fs::symlink("a.txt", r.join("link")).unwrap();
    std::fs::write(r.join(".gitignore"), "target/\n").unwrap();
    std::fs::create_dir_all(r.join(".git")).unwrap();
    std::fs::write(r.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    let agent = agent(
        vec![
            json!([{"name": "execute", "args": {"command":
                "printf 'changed' > a.txt && rm gone.txt && mkdir -p d/e && printf x > d/e/f.txt \
                 && chmod 600 keep.sh && rmdir sub/empty && ln -sf keep.sh link \
                 && mkdir target && echo built > target/out && echo moved > .git/HEAD"}}]),
            json!([{"name": "execute", "args": {"command": "rm -r d && printf again >> a.txt"}}]),
        ],
        Arc::new(LocalShellBackend::new(FilesystemBackend::new(r).unwrap())),
    );
    let thread = agent.thread("t3").unwrap();
    let before_1 = tree(r);
    turn(&snapshots, &thread, Some(r), "shell it").await;
    let before_2 = tree(r);
    assert_ne!(before_1, before_2);
    turn(&snapshots, &thread, Some(r), "again").await;
    let checkpointer = agent.checkpointer().unwrap().as_ref();

    snapshots
        .rewind(checkpointer, "t3", 2, Some(r), FILES_ONLY)
        .await
        .unwrap();
    assert_eq!(tree(r), before_2);

    let report = snapshots
        .rewind(checkpointer, "t3", 1, Some(r), FILES_ONLY)
        .await
        .unwrap();
    // Ignored files and `.git` are neither recorded nor touched.
    let mut expected = before_1.clone();
    for path in ["target", "target/out"] {
        expected.insert(path.into(), tree(r)[path].clone());
    }
    expected.insert(
        ".git/HEAD".into(),
        ("file".into(), b"moved\n".to_vec(), before_1[".git/HEAD"].2),
    );
    assert_eq!(tree(r), expected);
    assert_eq!(report.recreated, ["gone.txt", "sub/empty"]);
    assert_eq!(report.removed, ["d", "d/e", "d/e/f.txt"]);
    assert_eq!(report.restored, ["a.txt", "keep.sh", "link"]);
    assert!(report.conflicts.is_empty());
}

#[tokio::test]
async fn files_changed_by_hand_are_reported_and_overwritten_only_when_forced() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let snapshots = Snapshots::new(data.path());
    let r = root.path();
    std::fs::write(r.join("mine.txt"), "mine\n").unwrap();
    std::fs::write(r.join("agent.txt"), "v1\n").unwrap();
    let agent = agent(
        vec![
            json!([{"name": "edit_file", "args": {"file_path": "/agent.txt", "old_string": "v1", "new_string": "v2"}}]),
            json!([{"name": "edit_file", "args": {"file_path": "/agent.txt", "old_string": "v2", "new_string": "v3"}}]),
        ],
        Arc::new(FilesystemBackend::new(r).unwrap()),
    );
    let thread = agent.thread("t4").unwrap();
    let before_1 = tree(r);
    turn(&snapshots, &thread, Some(r), "one").await;
    // Between turns the user edits a file the agent never touches...
    std::fs::write(r.join("mine.txt"), "mine, edited\n").unwrap();
    turn(&snapshots, &thread, Some(r), "two").await;
    // ...and after the last turn, one the agent wrote.
    std::fs::write(r.join("agent.txt"), "v3 and mine\n").unwrap();
    let edited = tree(r);
    let checkpointer = agent.checkpointer().unwrap().as_ref();

    let plan = snapshots.plan("t4", 1, r).unwrap();
    assert_eq!(plan.conflicts, ["agent.txt", "mine.txt"]);
    let refused = snapshots
        .rewind(checkpointer, "t4", 1, Some(r), FILES_ONLY)
        .await;
    match refused {
        Err(RewindError::Conflicts(paths)) => assert_eq!(paths, ["agent.txt", "mine.txt"]),
        other => panic!("{other:?}"),
    }
    assert_eq!(tree(r), edited, "a refused rewind changes nothing");

    // Rewinding turn 2 alone: `mine.txt` was edited before its snapshot, so it is left;
    // `agent.txt` still holds the user's edit.
    let refused = snapshots
        .rewind(checkpointer, "t4", 2, Some(r), FILES_ONLY)
        .await;
    assert!(
        matches!(&refused, Err(RewindError::Conflicts(paths)) if paths == &["agent.txt"]),
        "{refused:?}"
    );
    // Without the user's edit, what the agent left is rewound without asking.
    std::fs::write(r.join("agent.txt"), "v3\n").unwrap();
    let report = snapshots
        .rewind(checkpointer, "t4", 2, Some(r), FILES_ONLY)
        .await
        .unwrap();
    assert_eq!(report.restored, ["agent.txt"]);
    assert!(report.conflicts.is_empty());

    std::fs::write(r.join("agent.txt"), "mine again\n").unwrap();
    let report = snapshots
        .rewind(
            checkpointer,
            "t4",
            1,
            Some(r),
            RewindOptions {
                force: true,
                ..FILES_ONLY
            },
        )
        .await
        .unwrap();
    assert_eq!(report.conflicts, ["agent.txt", "mine.txt"]);
    assert_eq!(tree(r), before_1);
}

#[tokio::test]
async fn state_files_are_rewound_with_the_files() {
    let data = tempfile::tempdir().unwrap();
    let snapshots = Snapshots::new(data.path());
    let agent = agent(
        vec![
            json!([{"name": "write_file", "args": {"file_path": "/notes.md", "content": "first"}}]),
            json!([{"name": "edit_file", "args": {"file_path": "/notes.md", "old_string": "first", "new_string": "second"}}]),
        ],
        Arc::new(deepagents::backends::StateBackend::default()),
    );
    let thread = agent.thread("t5").unwrap();
    turn(&snapshots, &thread, None, "one").await;
    turn(&snapshots, &thread, None, "two").await;
    let report = snapshots
        .rewind(
            agent.checkpointer().unwrap().as_ref(),
            "t5",
            2,
            None,
            FILES_ONLY,
        )
        .await
        .unwrap();
    assert_eq!(report.state_files, ["/notes.md"]);
    let state = thread.state().await.unwrap().unwrap();
    assert!(matches!(
        &state.state.files["/notes.md"].content,
        deepagents::core::FileContent::Text { text } if text == "first"
    ));
    // The conversation is untouched.
    assert_eq!(next_turn(Some(&state)), 3);
}

#[test]
fn snapshot_storage_stays_under_its_cap_and_unchanged_files_cost_nothing() {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let cap = 64 * 1024;
    let snapshots = Snapshots::new(data.path()).with_cap(cap);
    let r = root.path();
    // 40 KiB that never change, and a file that changes every turn.
    for i in 0..10 {
        std::fs::write(r.join(format!("still-{i}.bin")), vec![i as u8; 4096]).unwrap();
    }
    let objects = |data: &Path| walkdir(&data.join("t6/objects"));
    let none = BTreeMap::new();
    snapshots.record("t6", 1, "turn 1", Some(r), &none).unwrap();
    let first = snapshots.usage("t6").unwrap();
    assert!(first < cap);
    // An unchanged tree stores no content again.
    snapshots.record("t6", 2, "turn 2", Some(r), &none).unwrap();
    assert_eq!(objects(data.path()), 10);
    for turn in 3..=200u64 {
        std::fs::write(r.join("moving.txt"), format!("{turn}").repeat(300)).unwrap();
        snapshots
            .record("t6", turn, &format!("turn {turn}"), Some(r), &none)
            .unwrap();
        let used = snapshots.usage("t6").unwrap();
        assert!(used <= cap, "turn {turn}: {used} bytes");
    }
    let listed = snapshots.list("t6").unwrap();
    assert_eq!(listed.last().unwrap().turn, 200);
    assert!(listed.first().unwrap().turn > 1, "the oldest went first");
    assert!(listed.len() > 5, "only {} snapshots kept", listed.len());
    // Only the contents the kept snapshots refer to are stored.
    assert_eq!(objects(data.path()), 10 + listed.len());
}

fn walkdir(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| {
                    let e = e.unwrap();
                    if e.file_type().unwrap().is_dir() {
                        walkdir(&e.path())
                    } else {
                        1
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}
