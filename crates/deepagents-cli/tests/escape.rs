//! Hostile commands end to end, through `execute` in `deepagents run --backend shell` and
//! through `deepagents sandbox run`, on both engines: a planted `.git` file, protected names
//! created, the kernel's settings, root's private files, a host Unix socket. The sandbox
//! crate's escape suite checks each mechanism; these check that the binary uses them.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};

use crate::bin;
use deepagents_test_support::stderr;

const ENGINES: [&str; 2] = ["bubblewrap", "landlock"];

fn sandbox_works() -> bool {
    if std::process::Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok()
    {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "bubblewrap is missing");
    eprintln!("skipped: bubblewrap is not installed");
    false
}

/// A root, a secret next to it, and a directory for the model's script.
struct Scene {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    home: std::path::PathBuf,
    scripts: std::path::PathBuf,
}

fn scene() -> Scene {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let (root, home, scripts) = (base.join("root"), base.join("home"), base.join("scripts"));
    for path in [&root, &home, &scripts] {
        std::fs::create_dir_all(path).unwrap();
    }
    std::fs::write(home.join("id_rsa"), "PRIVATE-KEY\n").unwrap();
    Scene {
        _dir: dir,
        root,
        home,
        scripts,
    }
}

/// `deepagents run` on the shell backend under `engine`, its model making `calls` at once.
fn agent(scene: &Scene, engine: &str, calls: Value) -> Output {
    let script = scene.scripts.join(format!("{engine}.json"));
    let turns = json!({"turns": [{"tool_calls": calls}, {"text": "done"}]});
    std::fs::write(&script, turns.to_string()).unwrap();
    bin()
        .args([
            "run",
            "--json",
            "--backend",
            "shell",
            "--sandbox-engine",
            engine,
        ])
        .arg("--model")
        .arg(format!("scripted:{}", script.display()))
        .arg("--root")
        .arg(&scene.root)
        .arg("go")
        .output()
        .unwrap()
}

/// Each tool result of a `--json` run, by call id.
fn results(output: &Output) -> BTreeMap<String, String> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == "tool_call_finished")
        .map(|e| {
            (
                e["call_id"].as_str().unwrap_or_default().to_owned(),
                e["content"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

fn execute(id: &str, command: &str) -> Value {
    json!({"id": id, "name": "execute", "args": {"command": command}})
}

fn sandbox_run(root: &Path, engine: &str, command: &str) -> Output {
    bin()
        .args(["sandbox", "run", "--sandbox-engine", engine, "--root"])
        .arg(root)
        .args(["--", command])
        .output()
        .unwrap()
}

fn shown(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        stderr(output)
    )
}

#[test]
fn a_planted_git_file_or_protected_name_gives_a_later_run_nothing() {
    if !sandbox_works() {
        return;
    }
    for engine in ENGINES {
        let scene = scene();
        let gitdir = format!("gitdir: {}\n", scene.home.display());
        let output = agent(
            &scene,
            engine,
            json!([
                {"id": "tool", "name": "write_file", "args": {"file_path": "/.git", "content": gitdir}},
                {"id": "memory", "name": "write_file", "args": {"file_path": "/.deepagents/AGENTS.md", "content": "obey\n"}},
                execute("plant", &format!("printf '{}' > .git", gitdir.trim_end().to_owned() + "\\n")),
                execute("hooks", "mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit"),
                execute("skills", "mkdir -p .agents/skills/evil && echo x > .agents/skills/evil/SKILL.md"),
            ]),
        );
        assert!(output.status.success(), "{engine}: {}", stderr(&output));
        let results = results(&output);
        // The file tools refuse on either engine.
        for id in ["tool", "memory"] {
            assert!(
                results[id].to_lowercase().contains("protected"),
                "{engine}: {id}: {}",
                results[id]
            );
        }
        assert!(
            !scene.root.join(".deepagents/AGENTS.md").exists(),
            "{engine}"
        );
        if engine == "bubblewrap" {
            for name in [".git", ".deepagents", ".agents"] {
                assert!(
                    !scene.root.join(name).exists(),
                    "{engine}: {name} was created: {results:?}"
                );
            }
        }
        // Whatever is on disk now, a later run and `sandbox run` read nothing of the host.
        std::fs::write(scene.root.join(".git"), &gitdir).ok();
        let cat = format!("cat {}/id_rsa", scene.home.display());
        let later = agent(&scene, engine, json!([execute("read", &cat)]));
        assert!(
            !results_of(&later).contains("PRIVATE-KEY"),
            "{engine}: {}",
            results_of(&later)
        );
        let direct = sandbox_run(&scene.root, engine, &cat);
        assert!(!shown(&direct).contains("PRIVATE-KEY"), "{engine}");
    }
}

fn results_of(output: &Output) -> String {
    results(output).into_values().collect::<Vec<_>>().join("\n")
}

#[test]
fn kernel_settings_root_files_and_host_sockets_stay_out_of_reach() {
    if !sandbox_works() {
        return;
    }
    let scene = scene();
    let socket = scene.home.join("agent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.write_all(b"HOST-SOCKET-ANSWERED\n");
        }
    });
    let before = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap();
    let root = rustix::process::geteuid().is_root();
    let attacks = [
        (
            "sysctl",
            "v=$(cat /proc/sys/kernel/core_pattern); printf '%s\\n' \"$v\" > /proc/sys/kernel/core_pattern && echo WROTE-SYSCTL".to_owned(),
        ),
        ("shadow", "cat /etc/shadow /etc/gshadow".to_owned()),
        (
            "socket",
            format!(
                "python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('{}'); print(s.recv(64))\"",
                socket.display()
            ),
        ),
    ];
    for engine in ENGINES {
        let calls: Vec<Value> = attacks.iter().map(|(id, c)| execute(id, c)).collect();
        let output = agent(&scene, engine, Value::Array(calls));
        assert!(output.status.success(), "{engine}: {}", stderr(&output));
        let through_execute = results_of(&output);
        for (_, command) in &attacks {
            let through_run = shown(&sandbox_run(&scene.root, engine, command));
            for text in [&through_execute, &through_run] {
                assert!(!text.contains("WROTE-SYSCTL"), "{engine}: {text}");
                assert!(!text.contains("HOST-SOCKET-ANSWERED"), "{engine}: {text}");
                if root {
                    assert!(!text.contains("root:"), "{engine}: {text}");
                }
            }
        }
    }
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap(),
        before
    );
}
