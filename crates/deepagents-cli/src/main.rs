//! `deepagents`: run a deep agent from the terminal.

mod agents;
mod approvals;
mod config;
mod hooks;
mod local_context;
mod mcp;
mod progress;
mod sandbox;
mod serve;
mod shutdown;
mod threads;
mod trust;
mod tui;
mod workspace;

use std::io::{IsTerminal as _, Read as _, Write as _};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand, ValueEnum as _};
use deepagents::{Agent, CheckpointError, RunOptions, RunStatus, RunStream, models};
use futures::StreamExt as _;

/// Run a deep agent: a model that plans, calls tools and works until the task is done.
/// Without a subcommand, on a terminal, it opens the interactive agent (the TUI).
#[derive(Parser)]
#[command(
    name = "deepagents",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    chat: Box<ChatArgs>,
}

/// The interactive agent's flags: every `run` flag, and how to start.
#[derive(Args)]
struct ChatArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Reopen a thread: the most recent one, or thread ID.
    #[arg(short = 'r', long, value_name = "ID", num_args = 0..=1, default_missing_value = "")]
    resume: Option<String>,
    /// Start with this message (as the task argument does).
    #[arg(short = 'm', long, value_name = "MESSAGE")]
    message: Option<String>,
    /// Run TEXT headless and exit, as `deepagents run TEXT` does.
    #[arg(short = 'n', long, value_name = "TEXT")]
    non_interactive: Option<String>,
    /// Read the task from stdin and run it headless.
    #[arg(long)]
    stdin: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Run one task headless and print the final answer.
    Run(Box<RunArgs>),
    /// Open the interactive agent (the default on a terminal).
    Chat(Box<ChatArgs>),
    /// List, show or delete conversation threads.
    #[command(subcommand)]
    Threads(ThreadsCommand),
    /// Look into a repository the repository backend works on.
    #[command(subcommand)]
    Repo(RepoCommand),
    /// See how `execute` is confined on this machine, or try a command under the policy.
    #[command(subcommand)]
    Sandbox(SandboxCommand),
    /// The MCP servers a run would use, and their tools.
    #[command(subcommand)]
    Mcp(McpCommand),
    /// Serve the agent over HTTP with the LangGraph Platform API (the official
    /// langgraph-sdk clients and UIs built on them work unchanged).
    Serve(Box<serve::ServeArgs>),
}

/// Where `deepagents mcp` looks for servers (as `run` does).
#[derive(clap::Args)]
struct McpSources {
    /// The root whose project files are read (default: the current directory).
    #[arg(long, value_name = "DIR")]
    root: Option<std::path::PathBuf>,
    /// A .mcp.json file (repeatable), after the user's and the project's.
    #[arg(long = "mcp-config", value_name = "FILE")]
    mcp_config: Vec<std::path::PathBuf>,
    /// Use the project's .mcp.json and .deepagents/.mcp.json.
    #[arg(long)]
    trust_project: bool,
}

#[derive(Subcommand)]
enum McpCommand {
    /// Each server, its transport and whether it answers.
    List {
        #[command(flatten)]
        sources: McpSources,
    },
    /// One line per tool: the name exactly as the model sees it, then its description.
    Tools {
        /// Only this server's tools.
        server: Option<String>,
        /// A JSON array instead, for programs.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        sources: McpSources,
    },
}

#[derive(Subcommand)]
enum SandboxCommand {
    /// Tries each layer of the sandbox and says which engine confines commands and what it
    /// cannot enforce here.
    Check {
        /// The root the policy is for (default: the current directory).
        #[arg(long, value_name = "DIR")]
        root: Option<std::path::PathBuf>,
        /// The engine to check (default: auto, or `engine` in `[sandbox]`).
        #[arg(long, value_enum)]
        sandbox_engine: Option<sandbox::EngineSetting>,
        /// The config file (its `[sandbox]` section); as for `run`.
        #[arg(long, value_name = "FILE", env = "DEEPAGENTS_CONFIG")]
        config: Option<std::path::PathBuf>,
    },
    /// Runs a command as `execute` would (`deepagents sandbox run -- ls ~`).
    Run {
        /// The root the command runs in (default: the current directory).
        #[arg(long, value_name = "DIR")]
        root: Option<std::path::PathBuf>,
        /// The mode (default: workspace-write, or `mode` in `[sandbox]`).
        #[arg(long, value_enum)]
        sandbox: Option<sandbox::SandboxMode>,
        /// The engine (default: auto, or `engine` in `[sandbox]`).
        #[arg(long, value_enum)]
        sandbox_engine: Option<sandbox::EngineSetting>,
        /// The config file (its `[sandbox]` section); as for `run`.
        #[arg(long, value_name = "FILE", env = "DEEPAGENTS_CONFIG")]
        config: Option<std::path::PathBuf>,
        /// The command and its arguments, run by `/bin/sh -c`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

#[derive(Subcommand)]
enum RepoCommand {
    /// List the commits that changed a file or directory, newest first.
    Log {
        /// The path as the agent sees it (default `/`, the whole repository); under
        /// `/skills/NAME/` it is the linked skill repository's history.
        path: Option<String>,
        #[command(flatten)]
        repo: RepoArgs,
        /// One JSON object per commit (id, author, email, time, summary).
        #[arg(long)]
        json: bool,
        /// The config file (its `[repo]` section); as for `run`.
        #[arg(long, value_name = "FILE", env = "DEEPAGENTS_CONFIG")]
        config: Option<std::path::PathBuf>,
    },
}

/// Which repository, for `--backend repo` and `deepagents repo`.
#[derive(Args, Clone)]
struct RepoArgs {
    /// The repository: a local path (created on the first write when missing), a URL git can
    /// reach, or `owner/name` under `base` of `[repo]` in the config file.
    #[arg(long, value_name = "PATH_OR_URL")]
    repo: Option<String>,
    /// The branch (default: the repository's default branch, `main` for a new one).
    #[arg(long, value_name = "BRANCH", requires = "repo")]
    repo_branch: Option<String>,
}

#[derive(Args, Clone)]
struct RunArgs {
    /// The model as provider:model, e.g. `anthropic:claude-sonnet-4-5`, `openai:gpt-5`,
    /// `replay:session.json` or `scripted:examples/scripts/plan.json`. Beats
    /// DEEPAGENTS_MODEL, which beats `model` in the config file.
    #[arg(long, env = "DEEPAGENTS_MODEL")]
    model: Option<String>,
    /// The config file (TOML: `model`, `[providers.NAME]` base_url and max_retries,
    /// `[models."provider:model"]` context_window and max_output_tokens). Default:
    /// ~/.deepagents/config.toml, skipped when missing; a file named here must exist.
    /// Flags beat environment variables, which beat the file, which beats built-in defaults.
    #[arg(long, value_name = "FILE", env = "DEEPAGENTS_CONFIG")]
    config: Option<std::path::PathBuf>,
    /// The provider's endpoint, e.g. `http://127.0.0.1:8000/v1`. Beats the provider's
    /// `*_BASE_URL` variable, which beats `base_url` in the config file.
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    /// Record every request and response exchanged with the provider to this cassette file
    /// (API keys are never written); play it back with `--model replay:PATH`.
    #[arg(long, value_name = "PATH")]
    record: Option<std::path::PathBuf>,
    /// Retries of a failed model request (rate limits, server errors, broken connections);
    /// beats `max_retries` in the config file (default 2).
    #[arg(long, value_name = "N")]
    max_retries: Option<u32>,
    /// Ask the model to reason (think) first, at this effort: low, medium or high.
    #[arg(long, value_name = "EFFORT", value_parser = ["low", "medium", "high"])]
    reasoning_effort: Option<String>,
    /// Print one JSON event per line on stdout; the last line has "type":"final".
    #[arg(long)]
    json: bool,
    /// Print only the answer: no progress lines, no spending line.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Stop the run after SECONDS (the thread keeps what it did) and exit with status 124.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    timeout: Option<u64>,
    /// Most model calls the run may make.
    #[arg(long, default_value_t = deepagents::DEFAULT_MAX_TURNS, value_parser = clap::value_parser!(u32).range(1..))]
    max_turns: u32,
    /// Stop the run before a model call that would take its cost past USD dollars (at the
    /// models' prices; subagents included); resume the thread with a higher cap to go on.
    #[arg(long, value_name = "USD", value_parser = positive_dollars)]
    max_cost: Option<f64>,
    /// Stop the run before a model call that would take its tokens (prompt and answer,
    /// subagents included) past N.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_tokens: Option<u64>,
    /// The system prompt; built-in sections follow it.
    #[arg(long)]
    system_prompt: Option<String>,
    /// Offer the write_todos planning tool.
    #[arg(long)]
    todos: bool,
    /// Where files live: real files under --root (filesystem, the default), the same plus
    /// shell commands (shell), the run's memory (state), or a git repository with a commit
    /// per change (repo, with --repo; --repo alone implies it).
    #[arg(long, value_enum)]
    backend: Option<workspace::BackendKind>,
    #[command(flatten)]
    repo: RepoArgs,
    /// The workspace root for the filesystem and shell backends (default: current directory).
    #[arg(long, value_name = "DIR")]
    root: Option<std::path::PathBuf>,
    /// How `execute` (--backend shell) is confined: workspace-write (the default: the root
    /// writable, the system read-only, the rest of the host invisible, no network), read-only,
    /// or off (unconfined). Also `mode` in `[sandbox]` of the config file.
    #[arg(long, value_enum)]
    sandbox: Option<sandbox::SandboxMode>,
    /// What confines commands: auto (the default: bubblewrap where user namespaces work,
    /// else Landlock), bubblewrap, or landlock (the fallback, forced). Also `engine` in
    /// `[sandbox]`.
    #[arg(long, value_enum)]
    sandbox_engine: Option<sandbox::EngineSetting>,
    /// A command that runs without approval when the sandbox is off: commands starting with
    /// it word for word, with no `;`, `&`, `|`, redirection or substitution (repeatable;
    /// also `allow` in `[shell]`).
    #[arg(long = "shell-allow", value_name = "COMMAND")]
    shell_allow: Vec<String>,
    /// A Claude-Code-style hooks.json whose hooks run at points of the run (PreToolUse,
    /// PostToolUse, UserPromptSubmit, …); repeatable, after `~/.deepagents/hooks.json` and the
    /// project's `.deepagents/hooks.json` (with --trust-project).
    #[arg(long = "hooks", value_name = "FILE")]
    hook_files: Vec<std::path::PathBuf>,
    /// Run what the project configures to run commands: its `.deepagents/hooks.json`, its
    /// `.mcp.json` and `.deepagents/.mcp.json` servers.
    #[arg(long)]
    trust_project: bool,
    /// A .mcp.json file whose servers' tools the agent gets (repeatable), after
    /// `~/.deepagents/.mcp.json` and the project's `.deepagents/.mcp.json` and `.mcp.json`
    /// (with --trust-project); later files win by server name.
    #[arg(long = "mcp-config", value_name = "FILE")]
    mcp_config: Vec<std::path::PathBuf>,
    /// Use no MCP server at all.
    #[arg(long)]
    no_mcp: bool,
    /// Whether file paths are confined to --root (default true). With false, `/etc/hosts` is
    /// the host's `/etc/hosts` (the root is only the shell's working directory). Also
    /// `virtual_mode = false` in the config file.
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    virtual_mode: Option<bool>,
    /// Permission rules (TOML: [[rules]] operations, paths, mode) for every file operation.
    #[arg(long, value_name = "FILE")]
    permissions: Option<std::path::PathBuf>,
    /// A directory of subagent definitions (markdown with name/description/model frontmatter);
    /// repeatable, later ones win. `.deepagents/agents/` in --root (default: the current
    /// directory) is read first when it exists.
    #[arg(long = "agents", value_name = "DIR")]
    agent_dirs: Vec<std::path::PathBuf>,
    /// A directory of skills (folders with SKILL.md); repeatable, later ones win over earlier
    /// ones and over ~/.deepagents/agent/skills, .deepagents/skills and .agents/skills.
    #[arg(long = "skills", value_name = "DIR")]
    skill_dirs: Vec<std::path::PathBuf>,
    /// Keep the agent from changing memory: ~/.deepagents/agent/AGENTS.md (otherwise
    /// editable with edit_file) and /memories/ become read-only. Also `read_only_memory =
    /// true` in the config file.
    #[arg(long)]
    read_only_memory: bool,
    /// The model's context window in tokens, overriding its profile and `context_window` in
    /// the config file (try a small window on any model).
    #[arg(long, value_name = "N")]
    max_input_tokens: Option<u64>,
    /// Offer the compact_conversation tool, so the model can summarize its history on demand.
    #[arg(long)]
    compact_tool: bool,
    /// Approve every call that would wait for approval: shell commands, calls that permission
    /// rules in `interrupt` mode hold, and those of subagents. Otherwise each asks on a
    /// terminal, and is refused (with a message the model sees) when nobody can answer.
    #[arg(long)]
    auto_approve: bool,
    /// Pause before every call of TOOL for a decision (repeatable): asked on a terminal,
    /// an interrupt for `serve`'s clients.
    #[arg(long = "interrupt-on", value_name = "TOOL")]
    interrupt_on: Vec<String>,
    /// Continue (or, after a crash or Ctrl-C, resume) this conversation thread; it is
    /// checkpointed after every step in the data directory. Without a task, the thread resumes.
    #[arg(long, value_name = "ID")]
    thread: Option<String>,
    /// With --thread: when another run is using the thread, wait for it to finish instead of
    /// failing.
    #[arg(long, requires = "thread")]
    wait: bool,
    /// The task; `-` reads it from stdin. Optional with --thread (resume).
    task: Option<String>,
}

#[derive(Subcommand)]
enum ThreadsCommand {
    /// List the threads, most recent first.
    List,
    /// Print a thread's conversation.
    Show {
        /// The thread id.
        id: String,
    },
    /// Delete a thread and its checkpoints.
    Delete {
        /// The thread id.
        id: String,
    },
}

fn main() -> ExitCode {
    // The sandbox re-executes this program as its helper (the network bridge, Landlock).
    deepagents::backends::sandbox::helper::dispatch();
    let cli = Cli::parse();
    // Before anything starts: a signal during start-up stops it too. Commands that only read
    // and print have nothing to save, and exit at once on a signal.
    let orderly = !matches!(
        cli.command,
        Some(
            Command::Threads(_) | Command::Repo(_) | Command::Sandbox(SandboxCommand::Check { .. })
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
            eprintln!("error: {}", error_text(&format!("{e:#}")));
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
            Some(Command::Run(args)) => run(*args).await,
            Some(Command::Chat(args)) => chat(*args).await,
            None => start(default).await,
            Some(Command::Threads(command)) => threads::run(command).await,
            Some(Command::Repo(command)) => repo_command(command).await,
            Some(Command::Mcp(command)) => mcp_command(command).await,
            Some(Command::Sandbox(SandboxCommand::Check {
                root,
                sandbox_engine,
                config,
            })) => config::load(config.as_deref())
                .and_then(|config| sandbox::check(root, sandbox_engine, &config.sandbox)),
            Some(Command::Sandbox(SandboxCommand::Run {
                root,
                sandbox: mode,
                sandbox_engine,
                config,
                command,
            })) => {
                let config = config::load(config.as_deref())?;
                sandbox::run(
                    root,
                    mode.or(config.sandbox.mode).unwrap_or_default(),
                    sandbox_engine,
                    &config.sandbox,
                    &command,
                )
                .await
            }
            Some(Command::Serve(_)) => bail!("`serve` runs on a runtime of its own"),
        }
    });
    // The front end awaited whatever had to end (runs, their commands, checkpoints, servers);
    // what may be left is a read of the terminal on the blocking pool, which is not waited for.
    // The tasks still held are dropped here, on this thread, guards and all.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    result
}

/// `deepagents repo …`.
async fn repo_command(command: RepoCommand) -> anyhow::Result<ExitCode> {
    let RepoCommand::Log {
        path,
        repo,
        json,
        config,
    } = command;
    let Some(source) = repo.repo else {
        bail!("which repository? pass --repo PATH_OR_URL");
    };
    let config = config::load(config.as_deref())?;
    let backend = workspace::repo_backend(&source, repo.repo_branch.as_deref(), &config.repo)?;
    let path = path.unwrap_or_else(|| "/".to_owned());
    let vpath = deepagents::backends::VPath::parse(&path)
        .with_context(|| format!("`{path}` is not a path in the repository"))?;
    let commits = backend.history(&vpath).await?;
    let mut stdout = std::io::stdout().lock();
    for commit in &commits {
        if json {
            let line = serde_json::json!({
                "id": commit.id,
                "author": commit.author,
                "email": commit.email,
                "time": commit.time,
                "summary": commit.summary,
            });
            writeln!(stdout, "{line}")?;
        } else {
            let short = commit.id.get(..12).unwrap_or(&commit.id);
            writeln!(stdout, "{short} {} {}", commit.author, commit.summary)?;
        }
    }
    if commits.is_empty() && !json {
        eprintln!("no commits changed {path}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Exit status after Ctrl-C, as shells report a SIGINT death (`main` puts the status of the
/// signal that arrived in its place).
const EXIT_INTERRUPTED: u8 = 130;

/// The exit status of a run stopped by `--timeout` (as `timeout(1)`).
const EXIT_TIMEOUT: u8 = 124;

/// The exit status of a run stopped by its spend cap (`--max-cost`, `--max-tokens`).
const EXIT_SPEND_CAP: u8 = 3;

/// Which front end a session serves: what may ask the person, and how.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Front {
    /// `deepagents run`: approvals and servers' questions asked on the terminal when stdin
    /// is one.
    Headless,
    /// The TUI: approvals in its panel; nothing else may read the terminal.
    Tui,
    /// `deepagents serve`: approvals are the API's interrupts; nothing reads the terminal.
    Server,
}

impl Front {
    /// Whether someone can decide approvals.
    fn can_approve(self) -> bool {
        matches!(self, Self::Tui | Self::Server)
            || std::io::IsTerminal::is_terminal(&std::io::stdin())
    }
}

/// An agent built from the flags, and what must stay alive while it runs.
struct Session {
    agent: Agent,
    /// The model spec, for the status bar.
    model: String,
    store: std::sync::Arc<dyn deepagents::backends::Store>,
    /// Grants approvals of commands outside the sandbox make.
    grants: Option<deepagents::backends::sandbox::SharedPolicy>,
    /// The hooks front ends fire (`Notification`, `SessionEnd`).
    hooks: Option<deepagents::middleware::Hooks>,
    /// How `execute` is confined, for the status bar.
    sandbox: String,
    /// The root on disk, when the backend has one.
    root: Option<std::path::PathBuf>,
    /// Dropping it stops the MCP servers.
    mcp: Option<deepagents_mcp::Connections>,
    /// What runs ask the TUI while they go on (hooks' `ask`, servers' questions).
    questions: Option<tui::Questions>,
    /// The model's context window in tokens, when known.
    window: Option<u64>,
    /// Whether the project's hooks and MCP servers are trusted (kept when it is rebuilt).
    trusted: bool,
    /// The subagents the `task` tool offers: name and description.
    subagents: Vec<(String, String)>,
    /// `/manual` or `/auto` in the TUI (none when everything is approved anyway).
    manual: Option<approvals::ManualSwitch>,
    /// The server's view of the checkpointer (`deepagents serve`).
    watch: Option<std::sync::Arc<deepagents_server::StepWatch>>,
}

/// Builds the agent the flags describe, for `front`; `may_ask` lets it ask on the terminal
/// whether to trust the project (not once the TUI owns the terminal).
async fn prepare(args: &RunArgs, front: Front, may_ask: bool) -> anyhow::Result<Session> {
    prepare_watched(args, front, may_ask, None).await
}

/// [`prepare`], for the server: every assistant checkpoints through one `watch` (made from
/// this one's checkpointer when `None`).
async fn prepare_watched(
    args: &RunArgs,
    front: Front,
    may_ask: bool,
    watch: Option<std::sync::Arc<deepagents_server::StepWatch>>,
) -> anyhow::Result<Session> {
    let config = config::load(args.config.as_deref())?;
    let Some(spec) = args.model.clone().or_else(|| config.model.clone()) else {
        bail!(
            "no model given; pass --model provider:model, set DEEPAGENTS_MODEL or `model` in ~/.deepagents/config.toml (offline: --model scripted:PATH)"
        );
    };
    let mut options = models::ModelOptions {
        base_url: args.base_url.clone(),
        record: args.record.clone(),
        max_retries: args.max_retries,
        reasoning: args.reasoning_effort.as_deref().map(|effort| match effort {
            "low" => models::ReasoningEffort::Low,
            "high" => models::ReasoningEffort::High,
            _ => models::ReasoningEffort::Medium,
        }),
        ..models::ModelOptions::default()
    };
    config.apply(&spec, &mut options);
    let model = models::from_spec_with(&spec, &options).map_err(|error| match error {
        // The library's message names no flag; here there is one.
        models::SpecError::MissingBaseUrl { .. } => anyhow::anyhow!("{error} (--base-url URL)"),
        error => error.into(),
    })?;
    let window = args
        .max_input_tokens
        .or_else(|| model.profile().map(|p| p.max_input_tokens));
    let mut builder = Agent::builder(model)
        .todos(args.todos)
        .compact_tool(args.compact_tool)
        .max_turns(args.max_turns)
        .spend_limits(deepagents::core::SpendLimits {
            max_cost_usd: args.max_cost.or(config.limits.max_cost),
            max_tokens: args.max_tokens.or(config.limits.max_tokens),
        })
        .prices(config.price_book());
    let agent_dirs = agents::sources(args.root.as_deref(), &args.agent_dirs);
    let virtual_mode = args.virtual_mode.or(config.virtual_mode).unwrap_or(true);
    let (backend, repo) = match (args.backend, &args.repo.repo) {
        (None | Some(workspace::BackendKind::Repo), Some(source)) => (
            workspace::BackendKind::Repo,
            Some(workspace::repo_backend(
                source,
                args.repo.repo_branch.as_deref(),
                &config.repo,
            )?),
        ),
        (Some(workspace::BackendKind::Repo), None) => {
            bail!("--backend repo needs the repository: --repo PATH_OR_URL")
        }
        (Some(other), Some(_)) => bail!(
            "--repo is for --backend repo, not --backend {}",
            other
                .to_possible_value()
                .map_or_else(String::new, |v| v.get_name().to_owned())
        ),
        (kind, None) => (kind.unwrap_or(workspace::BackendKind::Filesystem), None),
    };
    let permissions = args
        .permissions
        .as_deref()
        .map(workspace::permissions)
        .transpose()?;
    let sandbox_mode = args.sandbox.or(config.sandbox.mode).unwrap_or_default();
    let workspace = workspace::open(
        backend,
        repo,
        args.root.clone(),
        &args.skill_dirs,
        args.read_only_memory || config.read_only_memory,
        args.thread.is_some() || front != Front::Headless,
        &workspace::DiskOptions {
            virtual_mode,
            shell: &config.shell,
            sandbox: sandbox_mode,
            sandbox_engine: args.sandbox_engine,
            sandbox_config: &config.sandbox,
            permissions: permissions.as_ref(),
        },
    )
    .await?;
    builder = builder
        .backend(workspace.backend.clone())
        .memory(workspace.memory)
        .skills(workspace.skills);
    if let Some(root) = &workspace.root {
        builder = builder.middleware(local_context::LocalContext::new(root, virtual_mode));
    }
    if let Some(permissions) = permissions {
        builder = builder.permissions(permissions);
    }
    // `execute` is offered only by a backend with a shell; the builder refuses interrupts
    // for tools that are not offered. Confined commands need no approval: the sandbox is the
    // guard. Unconfined ones (`--sandbox off`) ask, but for those the allow-list names.
    if !args.auto_approve
        && sandbox_mode == sandbox::SandboxMode::Off
        && workspace.backend.as_sandbox().is_some()
    {
        let mut allowed = args.shell_allow.clone();
        allowed.extend(config.shell.allow.iter().cloned());
        builder = builder.interrupt_on("execute", approvals::execute_config(allowed));
    }
    // Confined commands that name something outside the sandbox ask, where someone can
    // answer; elsewhere they run confined and fail where the sandbox stops them.
    let grants = workspace
        .sandbox
        .clone()
        .filter(|_| !args.auto_approve && front.can_approve());
    // The TUI switches between asking before every change (`/manual`) and only before what
    // leaves the sandbox (`/auto`) while it runs.
    let manual = (front == Front::Tui && !args.auto_approve).then(approvals::ManualSwitch::default);
    if let Some(manual) = &manual {
        for tool in approvals::FILE_CHANGES {
            builder = builder.interrupt_on(tool, approvals::manual_file_config(manual.clone()));
        }
        if sandbox_mode != sandbox::SandboxMode::Off && workspace.backend.as_sandbox().is_some() {
            builder = builder.interrupt_on(
                "execute",
                approvals::manual_execute_config(manual.clone(), grants.clone()),
            );
        }
    } else if let Some(policy) = &grants {
        builder = builder.interrupt_on("execute", approvals::outside_config(policy.clone()));
    }
    if let Some(tokens) = args.max_input_tokens {
        builder = builder.context_window(tokens);
    }
    let mut subagents = vec![(
        "general-purpose".to_owned(),
        "the built-in helper: the main agent's tools, in a fresh context".to_owned(),
    )];
    for subagent in agents::load(&agent_dirs)? {
        subagents.push((
            subagent.name().to_owned(),
            subagent.description().to_owned(),
        ));
        builder = builder.subagent(subagent);
    }
    if let Some(prompt) = args.system_prompt.clone() {
        builder = builder.system_prompt(prompt);
    }
    // The server sees every step a run saves through its watch.
    let watch = match (&workspace.checkpointer, front) {
        (Some(checkpointer), Front::Server) => {
            Some(watch.unwrap_or_else(|| deepagents_server::StepWatch::new(checkpointer.clone())))
        }
        _ => None,
    };
    match (&watch, &workspace.checkpointer) {
        (Some(watch), _) => builder = builder.checkpointer(watch.clone()),
        (None, Some(checkpointer)) => builder = builder.checkpointer(checkpointer.clone()),
        (None, None) => {}
    }
    if !args.auto_approve {
        for tool in &args.interrupt_on {
            builder = builder.interrupt_on(tool, deepagents::InterruptConfig::default());
        }
    }
    let hooks_root = match &workspace.root {
        Some(root) => root.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let trusted = trust::project(&hooks_root, args.trust_project, may_ask)?;
    // Who answers what a run asks while it goes on: a hook's `ask`, a server's question.
    let (approver, elicitor, questions) = match front {
        Front::Headless => (
            hooks::headless_approver(args.auto_approve),
            mcp::headless_elicitor(args.auto_approve),
            None,
        ),
        // Nobody at a terminal: hooks' `ask` is refused unless everything is approved, and
        // MCP servers are not offered questions.
        Front::Server => (args.auto_approve.then(hooks::always), None, None),
        Front::Tui => {
            let (asker, questions) = tui::Asker::channel();
            let asker = std::sync::Arc::new(asker);
            let approver: std::sync::Arc<dyn deepagents::middleware::HookApprover> =
                if args.auto_approve {
                    hooks::always()
                } else {
                    asker.clone()
                };
            (
                Some(approver),
                Some(asker as std::sync::Arc<dyn deepagents_mcp::Elicitor>),
                Some(questions),
            )
        }
    };
    let (hooks, notes) = hooks::load(&hooks_root, &args.hook_files, trusted, approver)?;
    for note in notes {
        eprintln!("{note}");
    }
    let front_hooks = (!hooks.is_empty()).then(|| hooks.clone());
    if !hooks.is_empty() {
        builder = builder.hooks(hooks);
    }
    let mut mcp_connections = None;
    if !args.no_mcp {
        let (servers, notes) = mcp::servers(&hooks_root, &args.mcp_config, trusted)?;
        for note in notes {
            eprintln!("{note}");
        }
        if !servers.is_empty() {
            let connections = mcp::connect(&servers, &hooks_root, elicitor).await;
            for problem in connections.tools().1 {
                eprintln!("warning: an MCP tool was left out: {problem}");
            }
            // A source rather than fixed tools: servers that announce `list_changed` get their
            // tools listed again before the next model call.
            builder = builder.tool_source(connections.tool_source());
            // Tools their server marks destructive ask first, where someone can answer.
            if !args.auto_approve && front.can_approve() {
                for name in connections.destructive_tools() {
                    builder = builder.interrupt_on(
                        name,
                        deepagents::InterruptConfig {
                            description: Some(
                                "Its MCP server marks this tool as destructive.".to_owned(),
                            ),
                            ..deepagents::InterruptConfig::default()
                        },
                    );
                }
            }
            mcp_connections = Some(connections);
        }
    }
    let agent = builder.ask_user(true).build()?;
    Ok(Session {
        agent,
        model: spec,
        store: workspace.store,
        grants,
        hooks: front_hooks,
        sandbox: match (&workspace.sandbox, sandbox_mode) {
            (_, sandbox::SandboxMode::Off) => "sandbox off".to_owned(),
            (Some(_), _) => "sandboxed".to_owned(),
            (None, _) => String::new(),
        },
        mcp: mcp_connections,
        root: workspace.root.clone(),
        questions,
        window,
        trusted,
        subagents,
        manual,
        watch,
    })
}

async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let task = match args.task.as_deref() {
        Some("-") => {
            let mut task = String::new();
            let _blocking = shutdown::blocking();
            std::io::stdin()
                .read_to_string(&mut task)
                .context("cannot read the task from stdin")?;
            Some(task)
        }
        other => other.map(str::to_owned),
    };
    if task.as_deref().is_none_or(|t| t.trim().is_empty()) && args.thread.is_none() {
        bail!("the task is empty; pass it as an argument or on stdin with `-`");
    }
    // A signal during start-up drops it: servers already started are killed on the way.
    let Ok(session) = shutdown::or_signal(prepare(&args, Front::Headless, true)).await else {
        return Ok(ExitCode::from(EXIT_INTERRUPTED));
    };
    let Session {
        agent,
        store,
        grants,
        hooks: front_hooks,
        mcp,
        ..
    } = session?;

    // A signal cancels the run as Ctrl-C always did: its commands are killed and what it did
    // is checkpointed before `drive` returns.
    let options = RunOptions {
        cancel: shutdown::token().child_token(),
        ..RunOptions::default()
    };
    let timed_out = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Some(seconds) = args.timeout {
        let (cancel, timed_out) = (options.cancel.clone(), timed_out.clone());
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(seconds)).await;
            timed_out.store(true, std::sync::atomic::Ordering::Release);
            cancel.cancel();
        });
    }
    let input = task.filter(|t| !t.trim().is_empty());
    let target = match &args.thread {
        Some(id) => Target::Thread {
            thread: agent.thread(id.as_str())?.with_options(options),
            wait: args.wait,
        },
        None => Target::Once(options),
    };
    let session = args.thread.clone().unwrap_or_default();
    let outcome = drive(
        &agent,
        &target,
        input,
        Output {
            json: args.json,
            quiet: args.quiet,
        },
        args.auto_approve,
        grants.as_ref(),
        front_hooks.as_ref().map(|hooks| (hooks, session.as_str())),
    )
    .await;
    if let Some(hooks) = &front_hooks {
        hooks
            .notify(
                &session,
                "SessionEnd",
                serde_json::json!({"reason": "exit"}),
            )
            .await;
    }
    // The run has ended, so no call is using them.
    if let Some(mcp) = &mcp {
        mcp.stop();
    }
    // Closing folds SQLite's write-ahead log back into the database instead of leaving it.
    store.close().await;
    if timed_out.load(std::sync::atomic::Ordering::Acquire)
        && outcome
            .as_ref()
            .is_ok_and(|code| *code == ExitCode::from(EXIT_INTERRUPTED))
    {
        eprintln!(
            "error: the run timed out after {} s (--timeout); what it did is kept",
            args.timeout.unwrap_or_default()
        );
        return Ok(ExitCode::from(EXIT_TIMEOUT));
    }
    outcome
}

/// Opens the TUI, or runs headless for `-n`/`--stdin`; without a terminal, says what to do.
async fn start(mut args: ChatArgs) -> anyhow::Result<ExitCode> {
    if let Some(text) = args.non_interactive.take() {
        args.run.task = Some(text);
        return run(args.run).await;
    }
    if args.stdin {
        args.run.task = Some("-".to_owned());
        return run(args.run).await;
    }
    if !(std::io::stdin().is_terminal() && std::io::stdout().is_terminal()) {
        bail!(
            "the interactive agent needs a terminal; run headless with `deepagents -n TASK`, `--stdin`, or `deepagents run TASK`"
        );
    }
    chat(args).await
}

/// The interactive agent.
async fn chat(args: ChatArgs) -> anyhow::Result<ExitCode> {
    let Ok(session) = shutdown::or_signal(prepare(&args.run, Front::Tui, true)).await else {
        return Ok(ExitCode::from(EXIT_INTERRUPTED));
    };
    let session = session?;
    let checkpointer =
        session.agent.checkpointer().cloned().context(
            "the interactive agent keeps threads; its data directory could not be opened",
        )?;
    let thread_id = match (args.resume.as_deref(), args.run.thread.clone()) {
        (Some(""), _) => Some(
            tui::latest_thread(checkpointer.as_ref())
                .await?
                .context("there is no thread to resume yet; start one with `deepagents`")?,
        ),
        (Some(id), _) => Some(id.to_owned()),
        (None, thread) => thread,
    };
    let first = args.message.clone().or(args.run.task.clone());
    tui::run(tui::Start {
        session,
        args: args.run.clone(),
        thread_id,
        first,
        auto_approve: args.run.auto_approve,
    })
    .await
}

/// What the CLI runs: a conversation thread, or one run that is not saved.
enum Target {
    /// `wait`: wait for another run of the thread to end (`--wait`) rather than fail.
    Thread {
        thread: deepagents::Thread,
        wait: bool,
    },
    Once(RunOptions),
}

/// Starts the first run: the task (on a thread, appended to it), or the thread's resume.
async fn first_stream(
    agent: &Agent,
    target: &Target,
    input: Option<String>,
) -> anyhow::Result<RunStream> {
    let (thread, wait) = match target {
        Target::Once(options) => {
            let run = deepagents::Run::from_task(input.unwrap_or_default());
            return Ok(agent.stream_run(run, options.clone()));
        }
        Target::Thread { thread, wait } => (thread, *wait),
    };
    if input.is_none() && thread.state().await?.is_none() {
        bail!(
            "thread `{}` does not exist yet; start it with a task",
            thread.id()
        );
    }
    let start = async |thread: &deepagents::Thread| match &input {
        Some(input) => thread.stream(input.clone()).await,
        None => thread.stream_resume().await,
    };
    match start(thread).await {
        Ok(stream) => Ok(stream),
        Err(error @ CheckpointError::Busy { .. }) if wait => {
            eprintln!("waiting: {error}");
            let waiting = thread.clone().with_lease_wait(std::time::Duration::MAX);
            Ok(start(&waiting).await?)
        }
        Err(error @ CheckpointError::Busy { .. }) => {
            bail!("{error}; pass --wait to wait for it")
        }
        Err(error) => Err(error.into()),
    }
}

/// Runs to the end, answering pauses, and prints the events and the answer.
/// How `run` prints.
#[derive(Clone, Copy)]
struct Output {
    /// Every event as a JSON line.
    json: bool,
    /// Only the answer.
    quiet: bool,
}

async fn drive(
    agent: &Agent,
    target: &Target,
    input: Option<String>,
    print: Output,
    auto_approve: bool,
    grants: Option<&deepagents::backends::sandbox::SharedPolicy>,
    hooks: Option<(&deepagents::middleware::Hooks, &str)>,
) -> anyhow::Result<ExitCode> {
    // Waiting for another run of the thread (`--wait`) ends with a signal.
    let Ok(first) = shutdown::or_signal(first_stream(agent, target, input)).await else {
        return Ok(ExitCode::from(EXIT_INTERRUPTED));
    };
    let mut stream = first?;
    let mut stdout = std::io::stdout().lock();
    let mut progress = progress::Progress::default();
    loop {
        while let Some(event) = stream.next().await {
            if print.json {
                serde_json::to_writer(&mut stdout, &event)?;
                stdout.write_all(b"\n")?;
                stdout.flush()?;
            } else if !print.quiet {
                progress.show(&event);
            }
        }
        let output = match stream.outcome().await {
            Ok(output) => output,
            Err(failure) => return Ok(report_failure(&failure)),
        };
        if output.status == RunStatus::Finished {
            if !print.json {
                writeln!(stdout, "{}", output.text)?;
                if output.run.spent.tokens() > 0 && !print.quiet {
                    eprintln!("{}", spent_line(&output.run.spent, &output.run.total_spent));
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        let decisions = if auto_approve {
            approvals::approve_all(&output.pending)
        } else {
            if let Some((hooks, session)) = hooks {
                let names: Vec<&str> = output.pending.iter().map(|a| a.name.as_str()).collect();
                hooks
                    .notify(
                        session,
                        "Notification",
                        serde_json::json!({
                            "message": format!("deepagents needs your approval for {}", names.join(", ")),
                            "notification_type": "permission_prompt",
                        }),
                    )
                    .await;
            }
            // Paused, the run is saved: a signal while the person answers exits at once.
            let _blocking = shutdown::blocking();
            approvals::ask(&output.pending)?
        };
        if let Some(policy) = grants {
            approvals::grant_approved(policy, &output.pending, &decisions);
        }
        stream = match target {
            // The thread continues from what its store holds, so nothing is written twice.
            Target::Thread { thread, .. } => match thread.stream_decide(decisions).await {
                Ok(stream) => stream,
                Err(failure) => return Ok(report_failure(&failure)),
            },
            Target::Once(options) => {
                let mut run = output.run;
                deepagents::decide(&mut run, decisions)?;
                agent.stream_run(run, options.clone())
            }
        };
    }
}

/// `deepagents mcp …`; a signal drops it, and the servers it started with it.
async fn mcp_command(command: McpCommand) -> anyhow::Result<ExitCode> {
    shutdown::or_signal(mcp_listing(command))
        .await
        .unwrap_or_else(|signal| Ok(ExitCode::from(signal.exit_code())))
}

async fn mcp_listing(command: McpCommand) -> anyhow::Result<ExitCode> {
    let root = |sources: &McpSources| match &sources.root {
        Some(root) => Ok(root.clone()),
        None => std::env::current_dir().context("cannot read the current directory; pass --root"),
    };
    match command {
        McpCommand::List { sources } => {
            mcp::list(&root(&sources)?, &sources.mcp_config, sources.trust_project).await
        }
        McpCommand::Tools {
            server,
            json,
            sources,
        } => {
            mcp::tools(
                &root(&sources)?,
                &sources.mcp_config,
                sources.trust_project,
                server.as_deref(),
                json,
            )
            .await
        }
    }
}

/// `--max-cost`: a positive number of dollars.
fn positive_dollars(text: &str) -> Result<f64, String> {
    match text.trim_start_matches('$').parse::<f64>() {
        Ok(dollars) if dollars.is_finite() && dollars > 0.0 => Ok(dollars),
        _ => Err(format!("`{text}` is not a positive number of dollars")),
    }
}

/// One line on what a run spent: `spent $0.0123 · 1,234 tokens (1,100 in, 800 cached, 134
/// out)`, and the conversation's total when it is more.
pub(crate) fn spent_line(
    spent: &deepagents::core::Spent,
    total: &deepagents::core::Spent,
) -> String {
    let mut line = format!("spent {}", progress::spent_summary(spent));
    if spent.unpriced_tokens > 0 {
        line.push_str(&format!(
            "; {} tokens of models without known prices are not in the cost",
            spent.unpriced_tokens
        ));
    }
    if total.tokens() > spent.tokens() {
        line.push_str(&format!(
            " · this conversation: ${:.4}, {} tokens",
            total.cost_usd,
            total.tokens()
        ));
    }
    line
}

/// Prints why a run failed; the exit status for it.
fn report_failure(failure: &deepagents::RunFailure) -> ExitCode {
    let hint = match failure.error {
        deepagents::RunError::TurnLimit(_) => " (--max-turns N)",
        _ => "",
    };
    eprintln!("error: {}{hint}", error_text(&failure.error.to_string()));
    if matches!(failure.error, deepagents::RunError::Cancelled) {
        ExitCode::from(EXIT_INTERRUPTED)
    } else if matches!(failure.error, deepagents::RunError::SpendCap(_)) {
        ExitCode::from(EXIT_SPEND_CAP)
    } else {
        ExitCode::FAILURE
    }
}

/// One line, except that a cassette diff keeps its lines so it stays readable.
fn error_text(text: &str) -> String {
    match text.split_once(":\n") {
        Some((head, diff)) if text.contains("differs from cassette") => {
            format!("{}:\n{}", one_line(head), diff.trim_end())
        }
        _ => one_line(text),
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
