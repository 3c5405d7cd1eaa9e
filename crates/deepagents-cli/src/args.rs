//! The command line: the subcommands and the flags of each, as clap parses them.

use clap::{Args, Parser, Subcommand};

use crate::{sandbox, workspace};

/// Run a deep agent: a model that plans, calls tools and works until the task is done.
/// Without a subcommand, on a terminal, it opens the interactive agent (the TUI).
#[derive(Parser)]
#[command(
    name = "deepagents",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub chat: Box<ChatArgs>,
}

/// The interactive agent's flags: every `run` flag, and how to start.
#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Reopen a thread: the most recent one, or thread ID.
    #[arg(short = 'r', long, value_name = "ID", num_args = 0..=1, default_missing_value = "")]
    pub resume: Option<String>,
    /// Start with this message (as the task argument does).
    #[arg(short = 'm', long, value_name = "MESSAGE")]
    pub message: Option<String>,
    /// Run TEXT headless and exit, as `deepagents run TEXT` does.
    #[arg(short = 'n', long, value_name = "TEXT")]
    pub non_interactive: Option<String>,
    /// Read the task from stdin and run it headless.
    #[arg(long)]
    pub stdin: bool,
}

/// The subcommands; without one, the interactive agent opens.
#[derive(Subcommand)]
pub enum Command {
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
    Serve(Box<ServeArgs>),
    /// Serve the agent to an editor over ACP, the Agent Client Protocol (JSON-RPC on stdin
    /// and stdout): Zed, JetBrains IDEs, Neovim and VS Code clients start it and drive it.
    /// Takes the flags of `run`; each session's root is the directory the editor gives.
    #[cfg(feature = "acp")]
    Acp(Box<RunArgs>),
    /// Print a shell completion script on stdout
    ///
    /// Install it where the shell looks for completions:
    ///
    ///   bash: deepagents completions bash > ~/.local/share/bash-completion/completions/deepagents
    ///   zsh:  deepagents completions zsh > ~/.zfunc/_deepagents
    ///         (with `fpath+=~/.zfunc` before `compinit` in ~/.zshrc)
    ///   fish: deepagents completions fish > ~/.config/fish/completions/deepagents.fish
    ///
    /// then open a new shell. PowerShell and Elvish scripts are printed the same way; source
    /// them from the shell's profile.
    #[command(verbatim_doc_comment)]
    Completions {
        /// The shell the script is for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Where `deepagents mcp` looks for servers (as `run` does).
#[derive(clap::Args)]
pub struct McpSources {
    /// The root whose project files are read (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub root: Option<std::path::PathBuf>,
    /// A .mcp.json file (repeatable), after the user's and the project's.
    #[arg(long = "mcp-config", value_name = "FILE")]
    pub mcp_config: Vec<std::path::PathBuf>,
    /// Use the project's .mcp.json and .deepagents/.mcp.json.
    #[arg(long)]
    pub trust_project: bool,
}

/// `deepagents mcp …`.
#[derive(Subcommand)]
pub enum McpCommand {
    /// Each server, its transport and whether it answers.
    List {
        #[command(flatten)]
        sources: McpSources,
    },
    /// One line per tool: the name exactly as the model sees it, then its description.
    ///
    /// A server that fails is named on stderr with its error; the other servers' tools are
    /// still listed. Exit status: 0 when at least one server started (or none is enabled); 1
    /// when every server failed, SERVER names no configured server, or a config file is broken.
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

/// `deepagents sandbox …`.
#[derive(Subcommand)]
pub enum SandboxCommand {
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
        /// The command, run by `/bin/sh -c`: one word is a shell command line (`-- 'ls | wc
        /// -l'`); several are a program and its arguments, each passed on as one argument
        /// (`-- sh -c 'echo "a b"; ls'`).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

/// `deepagents repo …`.
#[derive(Subcommand)]
pub enum RepoCommand {
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
pub struct RepoArgs {
    /// The repository: a local path (created on the first write when missing), a URL git can
    /// reach, or `owner/name` under `base` of `[repo]` in the config file.
    #[arg(long, value_name = "PATH_OR_URL")]
    pub repo: Option<String>,
    /// The branch (default: the repository's default branch, `main` for a new one).
    #[arg(long, value_name = "BRANCH", requires = "repo")]
    pub repo_branch: Option<String>,
}

/// What a run is made of: the model, the workspace and its confinement, limits, approvals,
/// the thread and the task; `run`, the TUI and `serve` all take them.
#[derive(Args, Clone)]
pub struct RunArgs {
    /// The model as provider:model, e.g. `anthropic:claude-sonnet-4-5`, `openai:gpt-5`,
    /// `replay:session.json` or `scripted:examples/scripts/plan.json`. Beats
    /// DEEPAGENTS_MODEL, which beats `model` in the config file.
    #[arg(long, env = "DEEPAGENTS_MODEL")]
    pub model: Option<String>,
    /// The config file (TOML: `model`, `[providers.NAME]` base_url and max_retries,
    /// `[models."provider:model"]` context_window and max_output_tokens). Default:
    /// ~/.deepagents/config.toml, skipped when missing; a file named here must exist.
    /// Flags beat environment variables, which beat the file, which beats built-in defaults.
    #[arg(long, value_name = "FILE", env = "DEEPAGENTS_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// The provider's endpoint, e.g. `http://127.0.0.1:8000/v1`. Beats the provider's
    /// `*_BASE_URL` variable, which beats `base_url` in the config file.
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// Record every request and response exchanged with the provider to this cassette file
    /// (API keys are never written); play it back with `--model replay:PATH`.
    #[arg(long, value_name = "PATH")]
    pub record: Option<std::path::PathBuf>,
    /// Retries of a failed model request (rate limits, server errors, broken connections);
    /// beats `max_retries` in the config file (default 2).
    #[arg(long, value_name = "N")]
    pub max_retries: Option<u32>,
    /// Ask the model to reason (think) first, at this effort: low, medium or high.
    #[arg(long, value_name = "EFFORT", value_parser = ["low", "medium", "high"])]
    pub reasoning_effort: Option<String>,
    /// Print one JSON event per line on stdout; the last line has "type":"final".
    #[arg(long)]
    pub json: bool,
    /// Print only the answer: no progress lines, no spending line.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Stop the run after SECONDS (the thread keeps what it did) and exit with status 124.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: Option<u64>,
    /// Most model calls the run may make.
    #[arg(long, default_value_t = deepagents::DEFAULT_MAX_TURNS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_turns: u32,
    /// Stop the run before a model call that would take its cost past USD dollars (at the
    /// models' prices; subagents included); resume the thread with a higher cap to go on.
    #[arg(long, value_name = "USD", value_parser = positive_dollars)]
    pub max_cost: Option<f64>,
    /// Stop the run before a model call that would take its tokens (prompt and answer,
    /// subagents included) past N.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_tokens: Option<u64>,
    /// The system prompt; built-in sections follow it.
    #[arg(long)]
    pub system_prompt: Option<String>,
    /// Offer the write_todos planning tool.
    #[arg(long)]
    pub todos: bool,
    /// Where files live: real files under --root (filesystem, the default), the same plus
    /// shell commands (shell), the run's memory (state), or a git repository with a commit
    /// per change (repo, with --repo; --repo alone implies it).
    #[arg(long, value_enum)]
    pub backend: Option<workspace::BackendKind>,
    #[command(flatten)]
    pub repo: RepoArgs,
    /// The workspace root for the filesystem and shell backends (default: current directory).
    #[arg(long, value_name = "DIR")]
    pub root: Option<std::path::PathBuf>,
    /// How `execute` (--backend shell) is confined: workspace-write (the default: the root
    /// writable, the system read-only, the rest of the host invisible, no network), read-only,
    /// or off (unconfined). Also `mode` in `[sandbox]` of the config file.
    #[arg(long, value_enum)]
    pub sandbox: Option<sandbox::SandboxMode>,
    /// What confines commands: auto (the default: bubblewrap where user namespaces work,
    /// else Landlock), bubblewrap, or landlock (the fallback, forced). Also `engine` in
    /// `[sandbox]`.
    #[arg(long, value_enum)]
    pub sandbox_engine: Option<sandbox::EngineSetting>,
    /// A command that runs without approval when the sandbox is off: commands starting with
    /// it word for word, with no `;`, `&`, `|`, redirection or substitution (repeatable;
    /// also `allow` in `[shell]`).
    #[arg(long = "shell-allow", value_name = "COMMAND")]
    pub shell_allow: Vec<String>,
    /// A Claude-Code-style hooks.json whose hooks run at points of the run (PreToolUse,
    /// PostToolUse, UserPromptSubmit, …); repeatable, after `~/.deepagents/hooks.json` and the
    /// project's `.deepagents/hooks.json` (with --trust-project).
    #[arg(long = "hooks", value_name = "FILE")]
    pub hook_files: Vec<std::path::PathBuf>,
    /// Run what the project configures to run commands: its `.deepagents/hooks.json`, its
    /// `.mcp.json` and `.deepagents/.mcp.json` servers.
    #[arg(long)]
    pub trust_project: bool,
    /// A .mcp.json file whose servers' tools the agent gets (repeatable), after
    /// `~/.deepagents/.mcp.json` and the project's `.deepagents/.mcp.json` and `.mcp.json`
    /// (with --trust-project); later files win by server name.
    #[arg(long = "mcp-config", value_name = "FILE")]
    pub mcp_config: Vec<std::path::PathBuf>,
    /// Use no MCP server at all.
    #[arg(long)]
    pub no_mcp: bool,
    /// Whether file paths are confined to --root (default true). With false, `/etc/hosts` is
    /// the host's `/etc/hosts` (the root is only the shell's working directory). Also
    /// `virtual_mode = false` in the config file.
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub virtual_mode: Option<bool>,
    /// Permission rules (TOML: [[rules]] operations, paths, mode) for every file operation.
    #[arg(long, value_name = "FILE")]
    pub permissions: Option<std::path::PathBuf>,
    /// A directory of subagent definitions (markdown with name/description/model frontmatter);
    /// repeatable, later ones win. `.deepagents/agents/` in --root (default: the current
    /// directory) is read first when it exists.
    #[arg(long = "agents", value_name = "DIR")]
    pub agent_dirs: Vec<std::path::PathBuf>,
    /// A directory of skills (folders with SKILL.md); repeatable, later ones win over earlier
    /// ones and over ~/.deepagents/agent/skills, .deepagents/skills and .agents/skills.
    #[arg(long = "skills", value_name = "DIR")]
    pub skill_dirs: Vec<std::path::PathBuf>,
    /// Keep the agent from changing memory: ~/.deepagents/agent/AGENTS.md (otherwise
    /// editable with edit_file) and /memories/ become read-only. Also `read_only_memory =
    /// true` in the config file.
    #[arg(long)]
    pub read_only_memory: bool,
    /// The model's context window in tokens, overriding its profile and `context_window` in
    /// the config file (try a small window on any model).
    #[arg(long, value_name = "N")]
    pub max_input_tokens: Option<u64>,
    /// Offer the compact_conversation tool, so the model can summarize its history on demand.
    #[arg(long)]
    pub compact_tool: bool,
    /// Offer the web_fetch tool: the model reads web pages (as Markdown) and text files by
    /// http(s) URL, public addresses only (internal hosts: `[web_fetch] allowed_hosts` in the
    /// config file); `/manual` asks before each fetch. Off by default.
    #[arg(long, alias = "fetch-url")]
    pub web_fetch: bool,
    /// Start in plan mode: the agent reads and explores but changes nothing (file changes,
    /// commands and subagents are refused) and ends with a plan; in the TUI, `/approve` (or
    /// Shift-Tab) approves it and the work starts.
    #[arg(long)]
    pub plan: bool,
    /// Approve every call that would wait for approval: shell commands, calls that permission
    /// rules in `interrupt` mode hold, and those of subagents. Otherwise each asks on a
    /// terminal, and is refused (with a message the model sees) when nobody can answer.
    #[arg(long)]
    pub auto_approve: bool,
    /// Pause before every call of TOOL for a decision (repeatable): asked on a terminal,
    /// an interrupt for `serve`'s clients.
    #[arg(long = "interrupt-on", value_name = "TOOL")]
    pub interrupt_on: Vec<String>,
    /// Continue (or, after a crash or Ctrl-C, resume) this conversation thread; it is
    /// checkpointed after every step in the data directory. Without a task, the thread resumes.
    #[arg(long, value_name = "ID")]
    pub thread: Option<String>,
    /// With --thread: when another run is using the thread, wait for it to finish instead of
    /// failing.
    #[arg(long, requires = "thread")]
    pub wait: bool,
    /// `run`: after the answer, wait up to SECONDS in all for the run's background tasks
    /// (async subagents); each ending starts a new turn, whose answer is printed too. Tasks
    /// still running then are left to the thread: their answers come the next time it runs.
    /// 0: do not wait.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub background_wait: u64,
    /// The task; `-` reads it from stdin. Optional with --thread (resume).
    pub task: Option<String>,
}

/// `deepagents threads …`.
#[derive(Subcommand)]
pub enum ThreadsCommand {
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
    /// Rewind a thread to before one of its turns: its files (under the root, and in the
    /// state) and its conversation, as the snapshot taken before that turn holds them.
    /// Without TURN, lists the turns.
    Rewind {
        /// The thread id.
        id: String,
        /// The turn (1 for the first user message); `deepagents threads rewind ID` lists them.
        turn: Option<u64>,
        /// Rewind the files only; the conversation goes on.
        #[arg(long, conflicts_with = "conversation_only")]
        files_only: bool,
        /// Rewind the conversation only; the files stay as they are.
        #[arg(long)]
        conversation_only: bool,
        /// Overwrite files changed by hand since the snapshot (listed otherwise, and nothing
        /// changes).
        #[arg(long)]
        force: bool,
    },
}

/// Flags of `deepagents serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// The agent, as for `run` (model, backend, root, permissions, sandbox, MCP, skills,
    /// subagents…); it is assistant `agent`.
    #[command(flatten)]
    pub run: RunArgs,
    /// Where to listen (default 127.0.0.1:2024, or `listen` of `[server]`).
    #[arg(long, value_name = "ADDRESS")]
    pub listen: Option<String>,
    /// An API key and the tenant it acts for (repeatable), beside `api_keys` of `[server]`.
    /// With none, no key is asked for and everything is tenant `default`.
    #[arg(long = "api-key", value_name = "KEY=TENANT")]
    pub api_keys: Vec<String>,
    /// An origin whose web pages may call the server from a browser (repeatable), as
    /// `scheme://host[:port]`; `*` allows any, `none` none. It replaces `cors` of `[server]`.
    /// Default: any origin on a loopback address without API keys, none otherwise.
    #[arg(long = "cors", value_name = "ORIGIN")]
    pub cors: Vec<String>,
    /// In a cluster, how many runs this server drives at once (default: no limit); 0 serves
    /// the API only and leaves the runs to the other servers.
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// A host a run's `webhook` URL may name (repeatable), beside `webhook_allowed_hosts` of
    /// `[server]`: `host`, `host:port`, or `*` for any host with public addresses. A private,
    /// loopback or link-local address is called only when listed by address.
    #[arg(long = "webhook-allow", value_name = "HOST[:PORT]")]
    pub webhook_allow: Vec<String>,
    /// Take bearer JWTs verified with this JSON Web Key Set (https; http on loopback only),
    /// each user (`sub`) its own tenant; beats `jwks_url` of `[server.auth]`.
    #[arg(long = "jwks-url", value_name = "URL")]
    pub jwks_url: Option<String>,
    /// A PEM public key (RSA, EC or Ed25519) that verifies bearer JWTs (repeatable), beside
    /// `public_keys` of `[server.auth]`.
    #[arg(long = "jwt-public-key", value_name = "PATH")]
    pub jwt_public_keys: Vec<std::path::PathBuf>,
    /// The environment variable holding an HS256 secret that verifies bearer JWTs; beats
    /// `hs256_secret_env` of `[server.auth]`.
    #[arg(long = "jwt-secret-env", value_name = "NAME")]
    pub jwt_secret_env: Option<String>,
    /// The `iss` bearer JWTs must carry; beats `issuer` of `[server.auth]`.
    #[arg(long = "jwt-issuer", value_name = "ISSUER")]
    pub jwt_issuer: Option<String>,
    /// An audience bearer JWTs' `aud` must name (repeatable); replaces `audience` of
    /// `[server.auth]`.
    #[arg(long = "jwt-audience", value_name = "AUDIENCE")]
    pub jwt_audience: Vec<String>,
}

/// `--max-cost`: a positive number of dollars.
fn positive_dollars(text: &str) -> Result<f64, String> {
    match text.trim_start_matches('$').parse::<f64>() {
        Ok(dollars) if dollars.is_finite() && dollars > 0.0 => Ok(dollars),
        _ => Err(format!("`{text}` is not a positive number of dollars")),
    }
}
