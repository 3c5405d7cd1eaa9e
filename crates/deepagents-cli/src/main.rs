//! `deepagents`: run a deep agent from the terminal.

mod progress;

use std::io::{Read as _, Write as _};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand};
use deepagents::{Agent, RunOptions, models};
use futures::StreamExt as _;

/// Run a deep agent: a model that plans, calls tools and works until the task is done.
#[derive(Parser)]
#[command(name = "deepagents", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one task headless and print the final answer.
    Run(RunArgs),
}

#[derive(Args)]
struct RunArgs {
    /// The model as provider:model, e.g. `scripted:examples/scripts/plan.json`.
    #[arg(long, env = "DEEPAGENTS_MODEL")]
    model: Option<String>,
    /// Print one JSON event per line on stdout; the last line has "type":"final".
    #[arg(long)]
    json: bool,
    /// Most model calls the run may make.
    #[arg(long, default_value_t = deepagents::DEFAULT_MAX_TURNS, value_parser = clap::value_parser!(u32).range(1..))]
    max_turns: u32,
    /// The system prompt; built-in sections follow it.
    #[arg(long)]
    system_prompt: Option<String>,
    /// Offer the write_todos planning tool.
    #[arg(long)]
    todos: bool,
    /// The task; `-` reads it from stdin.
    task: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Run(args) => runtime.block_on(run(args)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_line(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// Exit status after Ctrl-C, as shells report a SIGINT death.
const EXIT_INTERRUPTED: u8 = 130;

async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let task = if args.task == "-" {
        let mut task = String::new();
        std::io::stdin()
            .read_to_string(&mut task)
            .context("cannot read the task from stdin")?;
        task
    } else {
        args.task
    };
    if task.trim().is_empty() {
        bail!("the task is empty; pass it as an argument or on stdin with `-`");
    }
    let Some(spec) = args.model else {
        bail!(
            "no model given; pass --model provider:model or set DEEPAGENTS_MODEL (offline: --model scripted:PATH)"
        );
    };
    let model = models::from_spec(&spec)?;
    let mut builder = Agent::builder(model)
        .todos(args.todos)
        .max_turns(args.max_turns);
    if let Some(prompt) = args.system_prompt {
        builder = builder.system_prompt(prompt);
    }
    let agent = builder.build()?;

    let options = RunOptions::default();
    let cancel = options.cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.cancel();
        }
    });
    let mut stream = agent.stream_run(deepagents::Run::from_task(task), options);
    let mut stdout = std::io::stdout().lock();
    let mut progress = progress::Progress::default();
    while let Some(event) = stream.next().await {
        if args.json {
            serde_json::to_writer(&mut stdout, &event)?;
            stdout.write_all(b"\n")?;
            stdout.flush()?;
        } else {
            progress.show(&event);
        }
    }
    match stream.outcome().await {
        Ok(output) => {
            if !args.json {
                writeln!(stdout, "{}", output.text)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(failure) => {
            eprintln!("error: {}", one_line(&failure.error.to_string()));
            if matches!(failure.error, deepagents::RunError::Cancelled) {
                return Ok(ExitCode::from(EXIT_INTERRUPTED));
            }
            Ok(ExitCode::FAILURE)
        }
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
