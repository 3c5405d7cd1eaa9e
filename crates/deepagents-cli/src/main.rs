//! `deepagents`: run a deep agent from the terminal.
//!
//! This file parses the command line and hands each subcommand to its module: `args` holds
//! the flags, `session` builds the agent a front end drives, `headless` runs one task, `tui`
//! is the interactive agent and `serve` the HTTP server.

#[cfg(feature = "acp")]
mod acp;
mod agents;
mod approvals;
mod args;
mod commands;
mod config;
mod exit;
mod headless;
mod hooks;
mod local_context;
mod mcp;
mod plan;
mod progress;
mod rewind;
mod sandbox;
mod serve;
mod session;
mod shutdown;
mod threads;
mod trust;
mod tui;
mod workspace;

use std::io::IsTerminal as _;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Parser as _;

use args::{ChatArgs, Cli, Command, SandboxCommand};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // The sandbox re-executes this program as its helper (the network bridge, Landlock).
    deepagents::backends::sandbox::helper::dispatch();
    let cli = Cli::parse();
    // Before anything starts: a signal during start-up stops it too. Commands that only read
    // and print have nothing to save, and exit at once on a signal.
    let orderly = !matches!(
        cli.command,
        Some(
            Command::Threads(_)
                | Command::Repo(_)
                | Command::Sandbox(SandboxCommand::Check { .. })
                | Command::Completions { .. }
        )
    );
    if let Err(e) = shutdown::install(orderly) {
        eprintln!("error: cannot handle signals: {e}");
        return ExitCode::FAILURE;
    }
    // A signal is how a server is meant to stop: after an orderly stop it exits 0 (what
    // systemd and container runtimes count as a clean stop); every other command reports the
    // signal.
    let serving = matches!(cli.command, Some(Command::Serve(_)));
    let result = match cli.command {
        Some(Command::Serve(args)) => serve::main(*args),
        command => on_one_thread(command, *cli.chat),
    };
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", exit::error_text(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    };
    match shutdown::received() {
        Some(signal) => {
            // The front end stopped what it ran; anything a child left is ended here.
            shutdown::kill_children();
            if serving {
                code
            } else {
                ExitCode::from(signal.exit_code())
            }
        }
        None => code,
    }
}

/// Every command but `serve`, on one thread: a run waits on the model and on tools, and
/// parallel subagents interleave their waits on it as well; a second worker only adds
/// cross-thread wake-ups per step. Blocking work (files, SQLite) has tokio's blocking pool
/// either way.
fn on_one_thread(command: Option<Command>, default: ChatArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = runtime.block_on(async move {
        match command {
            Some(Command::Run(args)) => headless::run(*args).await,
            Some(Command::Chat(args)) => tui::chat(*args).await,
            None => start(default).await,
            Some(Command::Threads(command)) => threads::run(command).await,
            Some(Command::Repo(command)) => commands::repo_command(command).await,
            Some(Command::Mcp(command)) => commands::mcp_command(command).await,
            Some(Command::Sandbox(command)) => commands::sandbox_command(command).await,
            Some(Command::Completions { shell }) => commands::completions(shell),
            #[cfg(feature = "acp")]
            Some(Command::Acp(args)) => acp::run(*args).await,
            Some(Command::Serve(_)) => bail!("`serve` runs on a runtime of its own"),
        }
    });
    // The front end awaited whatever had to end (runs, their commands, checkpoints, servers);
    // what may be left is a read of the terminal on the blocking pool, which is not waited for.
    // The tasks still held are dropped here, on this thread, guards and all.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    result
}

/// Opens the TUI, or runs headless for `-n`/`--stdin`; without a terminal, says what to do.
async fn start(mut args: ChatArgs) -> anyhow::Result<ExitCode> {
    if let Some(text) = args.non_interactive.take() {
        args.run.task = Some(text);
        return headless::run(args.run).await;
    }
    if args.stdin {
        args.run.task = Some("-".to_owned());
        return headless::run(args.run).await;
    }
    if !(std::io::stdin().is_terminal() && std::io::stdout().is_terminal()) {
        bail!(
            "the interactive agent needs a terminal; run headless with `deepagents -n TASK`, `--stdin`, or `deepagents run TASK`"
        );
    }
    tui::chat(args).await
}
