//! `~/.deepagents/config.toml`, `--config` and `DEEPAGENTS_CONFIG`: the default model, provider
//! endpoints and retries, model limits, and their precedence under flags and variables.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::backends::reading_script;
use crate::bin;
use crate::stub::stub;

/// A scratch home whose `.deepagents/config.toml` holds `config` (none when `None`).
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new(config: Option<&str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        if let Some(config) = config {
            std::fs::create_dir_all(dir.path().join(".deepagents")).unwrap();
            std::fs::write(dir.path().join(".deepagents/config.toml"), config).unwrap();
        }
        Self { dir }
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join(".deepagents/config.toml")
    }

    /// `deepagents run --backend state …` with HOME here and no provider variables.
    fn command(&self) -> Command {
        let mut command = bin();
        command.env("HOME", self.dir.path());
        for var in [
            "DEEPAGENTS_CONFIG",
            "VLLM_BASE_URL",
            "VLLM_API_KEY",
            "ANTHROPIC_BASE_URL",
        ] {
            command.env_remove(var);
        }
        command.args(["run", "--backend", "state"]);
        command
    }
}

/// A script file answering `answer`, as a model spec.
fn answering(dir: &Path, name: &str, answer: &str) -> String {
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, json!({"turns": [{"text": answer}]}).to_string()).unwrap();
    format!("scripted:{}", path.display())
}

use deepagents_test_support::{stderr, stdout};

/// TOML's basic string for a path or spec.
fn quoted(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

#[test]
fn the_default_model_comes_from_the_config_file() {
    let scripts = tempfile::tempdir().unwrap();
    let spec = answering(scripts.path(), "config", "from the config");
    let home = Home::new(Some(&format!("model = {}\n", quoted(&spec))));
    let output = home.command().arg("go").output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stdout(&output).trim(), "from the config");

    // A missing default file is no error; the model must then come from elsewhere.
    let empty = Home::new(None);
    let output = empty.command().arg("go").output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("no model given"),
        "{}",
        stderr(&output)
    );
    let output = empty
        .command()
        .args(["--model", &spec, "go"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
}

#[test]
fn the_model_flag_beats_the_variable_which_beats_the_config_file() {
    let scripts = tempfile::tempdir().unwrap();
    let from_config = answering(scripts.path(), "config", "config");
    let from_env = answering(scripts.path(), "env", "env");
    let from_flag = answering(scripts.path(), "flag", "flag");
    let home = Home::new(Some(&format!("model = {}\n", quoted(&from_config))));
    let answer = |command: &mut Command| {
        let output = command.arg("go").output().unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        stdout(&output).trim().to_owned()
    };
    assert_eq!(answer(&mut home.command()), "config");
    assert_eq!(
        answer(home.command().env("DEEPAGENTS_MODEL", &from_env)),
        "env"
    );
    assert_eq!(
        answer(
            home.command()
                .env("DEEPAGENTS_MODEL", &from_env)
                .args(["--model", &from_flag])
        ),
        "flag"
    );
}

#[test]
fn config_and_deepagents_config_name_another_file_which_must_exist() {
    let scripts = tempfile::tempdir().unwrap();
    let spec = answering(scripts.path(), "elsewhere", "elsewhere");
    let default = answering(scripts.path(), "default", "default");
    let home = Home::new(Some(&format!("model = {}\n", quoted(&default))));
    let other = scripts.path().join("other.toml");
    std::fs::write(&other, format!("model = {}\n", quoted(&spec))).unwrap();

    for command in [
        home.command().arg("--config").arg(&other),
        home.command().env("DEEPAGENTS_CONFIG", &other),
    ] {
        let output = command.arg("go").output().unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        assert_eq!(stdout(&output).trim(), "elsewhere");
    }

    let missing = scripts.path().join("missing.toml");
    for command in [
        home.command().arg("--config").arg(&missing),
        home.command().env("DEEPAGENTS_CONFIG", &missing),
    ] {
        let output = command.arg("go").output().unwrap();
        assert_eq!(output.status.code(), Some(1));
        let error = stderr(&output);
        assert!(error.contains("cannot read the config file"), "{error}");
        assert!(error.contains(&missing.display().to_string()), "{error}");
    }
}

/// Runs with a config file holding `config` and returns the one-line error.
fn config_error(config: &str) -> (Home, String) {
    let scripts = tempfile::tempdir().unwrap();
    let spec = answering(scripts.path(), "unused", "unused");
    let home = Home::new(Some(config));
    let output = home
        .command()
        .args(["--model", &spec, "go"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", stdout(&output));
    assert!(stdout(&output).is_empty());
    let error = stderr(&output);
    assert!(
        error.contains(&home.config_path().display().to_string()),
        "{error}"
    );
    assert_eq!(error.lines().count(), 1, "{error}");
    (home, error)
}

#[test]
fn a_malformed_file_is_an_error_naming_the_file_and_line() {
    let (_home, error) = config_error("model = \"a:b\"\n\n[providers.vllm\nbase_url = 1\n");
    assert!(error.contains(", line 3"), "{error}");

    let (_home, error) = config_error("[providers.vllm]\nmax_retries = \"four\"\n");
    assert!(
        error.contains("line 2, key `providers.vllm.max_retries`"),
        "{error}"
    );
    assert!(error.contains("expected u32"), "{error}");
}

#[test]
fn unknown_keys_are_refused_with_the_known_ones() {
    let (_home, error) = config_error("model = \"a:b\"\n[providers.vllm]\nbase_ur = \"x\"\n");
    assert!(
        error.contains("line 3, key `providers.vllm.base_ur`: unknown field `base_ur`, expected `base_url` or `max_retries`"),
        "{error}"
    );

    let (_home, error) = config_error("modle = \"a:b\"\n");
    assert!(error.contains("line 1, key `modle`"), "{error}");
    assert!(
        error.contains("expected one of `model`, `read_only_memory`, `virtual_mode`, `shell`, `repo`, `web_fetch`, `sandbox`, `providers`, `models`, `limits`"),
        "{error}"
    );

    let (_home, error) = config_error("[models.\"vllm:m\"]\ncontext = 1\n");
    assert!(
        error.contains("expected one of `context_window`, `max_output_tokens`, `prices`"),
        "{error}"
    );

    let (_home, error) = config_error("[providers.opanai]\nbase_url = \"x\"\n");
    assert!(
        error.contains("line 1, key `providers.opanai`: unknown provider `opanai`"),
        "{error}"
    );
    assert!(error.contains("openai, openai_chat, anthropic"), "{error}");
}

#[test]
fn an_api_key_in_the_file_is_refused_pointing_at_the_variable() {
    let (_home, error) = config_error("[providers.anthropic]\napi_key = \"sk-ant-secret\"\n");
    assert!(
        error.contains("line 2, key `providers.anthropic.api_key`"),
        "{error}"
    );
    assert!(error.contains("set ANTHROPIC_API_KEY"), "{error}");
    assert!(!error.contains("sk-ant-secret"), "{error}");

    let (_home, error) =
        config_error("[models.\"google_genai:gemini-2.5-pro\"]\napi_key = \"k\"\n");
    assert!(
        error.contains("set GOOGLE_API_KEY or GEMINI_API_KEY"),
        "{error}"
    );

    let (_home, error) = config_error("api_key = \"k\"\n");
    assert!(error.contains("API keys are never read"), "{error}");
}

#[test]
fn a_base_url_from_the_config_file_reaches_the_server_and_flag_and_variable_beat_it() {
    let config = stub("config server", 200);
    let env = stub("env server", 200);
    let flag = stub("flag server", 200);
    let home = Home::new(Some(&format!(
        "model = \"vllm:tiny\"\n[providers.vllm]\nbase_url = {}\n",
        quoted(&config.url)
    )));
    let answer = |command: &mut Command| {
        let output = command.arg("hello").output().unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        stdout(&output).trim().to_owned()
    };
    assert_eq!(answer(&mut home.command()), "config server");
    assert_eq!(config.bodies.lock().unwrap()[0]["model"], "tiny");
    assert_eq!(
        answer(home.command().env("VLLM_BASE_URL", &env.url)),
        "env server"
    );
    assert_eq!(
        answer(
            home.command()
                .env("VLLM_BASE_URL", &env.url)
                .args(["--base-url", &flag.url])
        ),
        "flag server"
    );
    // A provider's settings apply to that provider only.
    let other = home
        .command()
        .env("OPENAI_COMPATIBLE_BASE_URL", &env.url)
        .args(["--model", "openai_compatible:tiny", "hello"])
        .output()
        .unwrap();
    assert!(other.status.success(), "{}", stderr(&other));
    assert_eq!(env.bodies.lock().unwrap().len(), 2);
    assert_eq!(config.bodies.lock().unwrap().len(), 1);
}

#[test]
fn max_retries_from_the_config_file_yields_to_the_flag() {
    let server = stub("", 500);
    let home = Home::new(Some(&format!(
        "[providers.vllm]\nbase_url = {}\nmax_retries = 1\n",
        quoted(&server.url)
    )));
    let attempts = |extra: &[&str]| {
        server.bodies.lock().unwrap().clear();
        let output = home
            .command()
            .args(["--model", "vllm:tiny"])
            .args(extra)
            .arg("hello")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1), "{}", stdout(&output));
        server.bodies.lock().unwrap().len()
    };
    assert_eq!(attempts(&[]), 2);
    assert_eq!(attempts(&["--max-retries", "0"]), 1);
}

#[test]
fn max_output_tokens_from_the_config_file_sets_the_request_limit() {
    let server = stub("", 400);
    let url = server.url.trim_end_matches("/v1").to_owned();
    let sent_max_tokens = |config: &str| {
        server.bodies.lock().unwrap().clear();
        let home = Home::new(Some(&format!(
            "model = \"anthropic:claude-sonnet-4-6\"\n[providers.anthropic]\nbase_url = {}\n{config}",
            quoted(&url)
        )));
        let output = home
            .command()
            .env("ANTHROPIC_API_KEY", "test-key")
            .arg("hello")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1), "{}", stdout(&output));
        let bodies = server.bodies.lock().unwrap();
        assert_eq!(bodies.len(), 1, "{}", stderr(&output));
        bodies[0]["max_tokens"].as_u64().unwrap()
    };
    let built_in = sent_max_tokens("");
    assert_ne!(built_in, 1234);
    let configured =
        sent_max_tokens("[models.\"anthropic:claude-sonnet-4-6\"]\nmax_output_tokens = 1234\n");
    assert_eq!(configured, 1234);
}

#[test]
fn a_small_context_window_in_the_config_file_makes_the_run_summarize() {
    let root = tempfile::tempdir().unwrap();
    let line = "a line of the big file, long enough to count\n";
    std::fs::write(root.path().join("big.txt"), line.repeat(1_200 / line.len())).unwrap();
    let model = reading_script(root.path());
    let summarized = |config: &str, extra: &[&str]| {
        let home = Home::new(Some(config));
        let output = bin()
            .env("HOME", home.dir.path())
            .env_remove("DEEPAGENTS_CONFIG")
            .args(["run", "--json", "--model", &model])
            .args(extra)
            .arg("--root")
            .arg(root.path())
            .arg("read big.txt")
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        let events: Vec<Value> = stdout(&output)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(events.last().unwrap()["text"], "read it all");
        events.iter().filter(|e| e["type"] == "summarized").count()
    };
    let small = format!("[models.{}]\ncontext_window = 4000\n", quoted(&model));
    assert_eq!(summarized("", &[]), 0);
    assert!(summarized(&small, &[]) > 0);
    // --max-input-tokens beats the file.
    assert_eq!(summarized(&small, &["--max-input-tokens", "1000000"]), 0);
    // Limits are per model spec: another spec's entry changes nothing.
    assert_eq!(
        summarized(
            "[models.\"scripted:other.json\"]\ncontext_window = 4000\n",
            &[]
        ),
        0
    );
}

/// The tool results of a `--json` run, by call id.
fn results(output: &std::process::Output) -> std::collections::BTreeMap<String, String> {
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == "tool_call_finished")
        .map(|e| {
            (
                e["call_id"].as_str().unwrap().to_owned(),
                e["content"][0]["text"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_shell_section_sets_timeout_output_cap_and_environment() {
    let home = Home::new(Some(
        "[shell]\ntimeout = 1\nmax_output = 200\nenv = { GREETING = \"hello there\" }\n",
    ));
    let root = tempfile::tempdir().unwrap();
    let script = home.dir.path().join("shell.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [
                {"id": "env", "name": "execute", "args": {"command": "env"}},
                {"id": "slow", "name": "execute", "args": {"command": "sleep 5; echo late"}},
                {"id": "loud", "name": "execute", "args": {"command": "yes | head -c 5000"}}
            ]},
            {"text": "done"}
        ]})
        .to_string(),
    )
    .unwrap();
    let output = bin()
        .env("HOME", home.dir.path())
        .env_remove("DEEPAGENTS_CONFIG")
        .env("SECRET_TOKEN", "do-not-leak")
        .args([
            "run",
            "--json",
            "--auto-approve",
            "--backend",
            "shell",
            "--model",
        ])
        .arg(format!("scripted:{}", script.display()))
        .arg("--root")
        .arg(root.path())
        .arg("go")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let results = results(&output);
    let env = &results["env"];
    assert!(env.contains("GREETING=hello there"), "{env}");
    assert!(
        !env.contains("SECRET_TOKEN"),
        "the host's environment stays out: {env}"
    );
    assert!(
        !env.contains("PATH="),
        "the environment is empty unless asked: {env}"
    );
    assert!(!results["slow"].contains("late"), "{}", results["slow"]);
    assert!(
        results["slow"].contains("past its timeout"),
        "{}",
        results["slow"]
    );
    assert!(results["loud"].len() < 1_000, "{}", results["loud"]);

    let error = config_error("[shell]\ntimeot = 1\n").1;
    assert!(error.contains("timeot"), "{error}");
}

#[test]
fn virtual_mode_false_reaches_host_paths() {
    let home = Home::new(None);
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let file = outside.path().join("note.txt");
    std::fs::write(&file, "from outside the root\n").unwrap();
    let script = home.dir.path().join("read.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [{"id": "r", "name": "read_file", "args": {"file_path": file.display().to_string()}}]},
            {"text": "done"}
        ]})
        .to_string(),
    )
    .unwrap();
    let run = |extra: &[&str]| {
        bin()
            .env("HOME", home.dir.path())
            .env_remove("DEEPAGENTS_CONFIG")
            .args(["run", "--json", "--model"])
            .arg(format!("scripted:{}", script.display()))
            .args(extra)
            .arg("--root")
            .arg(root.path())
            .arg("go")
            .output()
            .unwrap()
    };
    let confined = run(&[]);
    assert!(confined.status.success(), "{}", stderr(&confined));
    assert!(
        !results(&confined)["r"].contains("from outside"),
        "confined by default"
    );
    let host = run(&["--virtual-mode", "false"]);
    assert!(host.status.success(), "{}", stderr(&host));
    assert!(
        results(&host)["r"].contains("from outside the root"),
        "{:?}",
        results(&host)
    );
}

#[test]
fn the_prompt_tells_the_model_where_it_works() {
    let server = stub("ok", 200);
    let home = Home::new(Some(&format!(
        "model = \"vllm:tiny\"\n[providers.vllm]\nbase_url = {}\n",
        quoted(&server.url)
    )));
    let root = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let status = Command::new("git")
            .arg("-C")
            .arg(root.path())
            .args(args)
            .output()
            .unwrap();
        assert!(status.status.success(), "{}", stderr(&status));
    };
    git(&["init", "-q", "-b", "trunk"]);
    std::fs::write(root.path().join("new.txt"), "x").unwrap();
    let output = bin()
        .env("HOME", home.dir.path())
        .env_remove("DEEPAGENTS_CONFIG")
        .env_remove("VLLM_BASE_URL")
        .args(["run", "--root"])
        .arg(root.path())
        .arg("hello")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let body = server.bodies.lock().unwrap()[0].clone();
    let system = body["messages"][0]["content"].to_string();
    let root_path = root.path().canonicalize().unwrap();
    assert!(system.contains("## Environment"), "{system}");
    assert!(
        system.contains(&format!("Working directory: `{}`", root_path.display())),
        "{system}"
    );
    assert!(
        system.contains("Git: branch `trunk`, 0 changed and 1 untracked file(s)"),
        "{system}"
    );
    assert!(system.contains(std::env::consts::OS), "{system}");
}

#[test]
fn max_output_tokens_from_the_config_file_reaches_chat_completions_servers() {
    let server = stub("ok", 200);
    let sent = |config: &str| {
        server.bodies.lock().unwrap().clear();
        let home = Home::new(Some(&format!(
            "model = \"vllm:tiny\"\n[providers.vllm]\nbase_url = {}\n{config}",
            quoted(&server.url)
        )));
        let output = home.command().arg("hello").output().unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        let bodies = server.bodies.lock().unwrap();
        bodies
            .iter()
            .rfind(|b| b["messages"].is_array())
            .unwrap()
            .clone()
    };
    let body = sent("[models.\"vllm:tiny\"]\nmax_output_tokens = 777\n");
    // Under the name llama.cpp, vLLM and Ollama read.
    assert_eq!(body["max_tokens"], 777, "{body}");
    assert!(body.get("max_completion_tokens").is_none(), "{body}");
    // A window alone sends no cap: the assumed output limit is not the user's.
    let body = sent("[models.\"vllm:tiny\"]\ncontext_window = 8192\n");
    assert!(body.get("max_tokens").is_none(), "{body}");
    let body = sent("");
    assert!(body.get("max_tokens").is_none(), "{body}");
}
