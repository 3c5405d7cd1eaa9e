//! `deepagents threads rewind`: the snapshots `run --thread` takes before each turn, and
//! rewinding files changed by `execute` and the conversation.

use std::path::Path;
use std::process::Output;

use serde_json::json;

use crate::bin;

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn threads_rewind_restores_what_execute_changed_and_the_conversation() {
    let data = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    std::fs::write(r.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(r.join("gone.txt"), "bye\n").unwrap();
    let script = data.path().join("script.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [{"name": "execute", "args": {"command": "printf beta > a.txt && rm gone.txt && mkdir d && echo new > d/new.txt"}}]},
            {"text": "first done"},
            {"tool_calls": [{"name": "execute", "args": {"command": "echo more >> a.txt"}}]},
            {"text": "second done"}
        ]})
        .to_string(),
    )
    .unwrap();
    let model = format!("scripted:{}", script.display());
    let deepagents = |args: &[&str]| {
        bin()
            .args(args)
            .env("DEEPAGENTS_DATA_DIR", data.path())
            .output()
            .unwrap()
    };
    let turn = |task: &str| {
        let output = bin()
            .args([
                "run",
                "--auto-approve",
                "--backend",
                "shell",
                "--sandbox",
                "off",
                "--model",
                &model,
                "--thread",
                "work",
                "--root",
            ])
            .arg(r)
            .arg(task)
            .env("DEEPAGENTS_DATA_DIR", data.path())
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
    };
    let read = |path: &str| std::fs::read_to_string(r.join(path)).ok();
    turn("change things");
    turn("change more");
    assert_eq!(read("a.txt").as_deref(), Some("betamore\n"));

    let listed = deepagents(&["threads", "rewind", "work"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert_eq!(
        stdout(&listed),
        "  1  change things\n  2  change more\n",
        "{}",
        stderr(&listed)
    );

    // The files of turn 2, the conversation kept.
    let rewound = deepagents(&["threads", "rewind", "work", "2", "--files-only"]);
    assert!(rewound.status.success(), "{}", stderr(&rewound));
    assert_eq!(stdout(&rewound), "restored: a.txt\n");
    assert_eq!(read("a.txt").as_deref(), Some("beta"));

    // A file edited by hand is listed and left, until --force.
    std::fs::write(r.join("d/new.txt"), "mine\n").unwrap();
    let refused = deepagents(&["threads", "rewind", "work", "1"]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("  d/new.txt"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(read("d/new.txt").as_deref(), Some("mine\n"));
    assert_eq!(read("a.txt").as_deref(), Some("beta"));

    let forced = deepagents(&["threads", "rewind", "work", "1", "--force"]);
    assert!(forced.status.success(), "{}", stderr(&forced));
    let said = stdout(&forced);
    assert!(said.contains("recreated: gone.txt"), "{said}");
    assert!(said.contains("removed: d, d/new.txt"), "{said}");
    assert!(
        said.contains("overwritten (changed by hand): d/new.txt"),
        "{said}"
    );
    assert!(
        said.contains("conversation: continues from before turn 1"),
        "{said}"
    );
    assert_eq!(read("a.txt").as_deref(), Some("alpha\n"));
    assert_eq!(read("gone.txt").as_deref(), Some("bye\n"));
    assert!(!r.join("d").exists());
    let shown = deepagents(&["threads", "show", "work"]);
    assert!(!stdout(&shown).contains("user:"), "{}", stdout(&shown));

    // Deleting the thread deletes its snapshots.
    let deleted = deepagents(&["threads", "delete", "work"]);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    assert!(!Path::new(&data.path().join("snapshots/work")).exists());
}
