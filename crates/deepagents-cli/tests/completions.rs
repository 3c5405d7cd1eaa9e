//! `deepagents completions SHELL`: completion scripts generated from the command line.

use std::process::Output;

use deepagents_test_support::{stderr, stdout};

use crate::bin;

fn completions(shell: &str) -> Output {
    bin().args(["completions", shell]).output().unwrap()
}

#[test]
fn bash_completion_defines_its_function_and_offers_the_subcommands() {
    let output = completions("bash");
    assert!(output.status.success(), "{}", stderr(&output));
    let script = stdout(&output);
    assert!(script.contains("_deepagents()"), "{script}");
    assert!(
        script.contains("complete -F _deepagents") && script.contains("deepagents"),
        "{script}"
    );
    for word in [
        "serve",
        "run",
        "threads",
        "sandbox",
        "completions",
        "--timeout",
    ] {
        assert!(script.contains(word), "`{word}` missing from:\n{script}");
    }
    // The help says where to put it.
    let help = bin().args(["completions", "--help"]).output().unwrap();
    assert!(
        stdout(&help).contains("~/.local/share/bash-completion/completions/deepagents"),
        "{}",
        stdout(&help)
    );
    // bash itself accepts it, where there is a bash.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deepagents.bash");
    std::fs::write(&path, &script).unwrap();
    match std::process::Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()
    {
        Ok(checked) => assert!(checked.status.success(), "{}", stderr(&checked)),
        Err(error) => eprintln!("skipped `bash -n`: {error}"),
    }
}

#[test]
fn zsh_fish_powershell_and_elvish_scripts_have_their_shell_s_form() {
    let zsh = completions("zsh");
    assert!(zsh.status.success(), "{}", stderr(&zsh));
    assert!(
        stdout(&zsh).starts_with("#compdef deepagents"),
        "{}",
        stdout(&zsh)
    );
    let fish = completions("fish");
    assert!(fish.status.success(), "{}", stderr(&fish));
    assert!(
        stdout(&fish).contains("complete -c deepagents"),
        "{}",
        stdout(&fish)
    );
    assert!(stdout(&fish).contains("serve"), "{}", stdout(&fish));
    let powershell = completions("powershell");
    assert!(powershell.status.success(), "{}", stderr(&powershell));
    assert!(
        stdout(&powershell).contains("Register-ArgumentCompleter"),
        "{}",
        stdout(&powershell)
    );
    let elvish = completions("elvish");
    assert!(elvish.status.success(), "{}", stderr(&elvish));
    assert!(
        stdout(&elvish).contains("edit:completion"),
        "{}",
        stdout(&elvish)
    );
}

#[test]
fn an_unknown_shell_is_refused_with_the_shells_there_are() {
    let output = completions("tcsh");
    assert!(!output.status.success());
    assert_eq!(output.status.code(), Some(2));
    assert!(stdout(&output).is_empty(), "{}", stdout(&output));
    let message = stderr(&output);
    assert!(message.contains("invalid value 'tcsh'"), "{message}");
    assert!(
        message.contains("bash, elvish, fish, powershell, zsh"),
        "{message}"
    );
    // No shell at all says which argument is missing.
    let missing = bin().arg("completions").output().unwrap();
    assert_eq!(missing.status.code(), Some(2));
    assert!(stderr(&missing).contains("<SHELL>"), "{}", stderr(&missing));
}
