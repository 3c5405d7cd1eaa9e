//! The agent a front end drives, built from the flags, the config file and the project:
//! model, workspace, approval rules, subagents, hooks and MCP servers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use clap::ValueEnum as _;
use deepagents::backends::Permissions;
use deepagents::{Agent, AgentBuilder, InterruptConfig, models};

use crate::args::RunArgs;
use crate::config::Config;
use crate::{agents, approvals, config, hooks, local_context, mcp, sandbox, trust, tui, workspace};

/// Which front end a session serves: what may ask the person, and how.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// `deepagents run`: approvals and servers' questions asked on the terminal when stdin
    /// is one.
    Headless,
    /// The TUI: approvals in its panel; nothing else may read the terminal.
    Tui,
    /// `deepagents serve`: approvals are the API's interrupts; nothing reads the terminal.
    Server,
    /// `deepagents acp`: an editor asks the person (ACP permission requests) and switches
    /// between asking before every change and not (session modes); stdin is the protocol.
    #[cfg_attr(not(feature = "acp"), allow(dead_code))]
    Acp,
}

impl Front {
    /// Whether someone can decide approvals.
    fn can_approve(self) -> bool {
        matches!(self, Self::Tui | Self::Server | Self::Acp)
            || std::io::IsTerminal::is_terminal(&std::io::stdin())
    }
}

/// An agent built from the flags, and what must stay alive while it runs.
pub struct Session {
    /// The agent the front end runs.
    pub agent: Agent,
    /// The model spec, for the status bar.
    pub model: String,
    /// The database of long-term memory and threads, closed before exiting.
    pub store: Arc<dyn deepagents::backends::Store>,
    /// Grants approvals of commands outside the sandbox make.
    pub grants: Option<deepagents::backends::sandbox::SharedPolicy>,
    /// The hooks front ends fire (`Notification`, `SessionEnd`).
    pub hooks: Option<deepagents::middleware::Hooks>,
    /// How `execute` is confined, for the status bar.
    pub sandbox: String,
    /// The root on disk, when the backend has one.
    pub root: Option<PathBuf>,
    /// Dropping it stops the MCP servers.
    pub mcp: Option<deepagents_mcp::Connections>,
    /// What runs ask the TUI while they go on (hooks' `ask`, servers' questions).
    pub questions: Option<tui::Questions>,
    /// The model's context window in tokens, when known.
    pub window: Option<u64>,
    /// Whether the project's hooks and MCP servers are trusted (kept when it is rebuilt).
    pub trusted: bool,
    /// The subagents the `task` tool offers: name and description.
    pub subagents: Vec<(String, String)>,
    /// `/manual` or `/auto` in the TUI (none when everything is approved anyway).
    pub manual: Option<approvals::ManualSwitch>,
    /// Plan mode: in the TUI (Shift-Tab, `/plan`), or for a run given `--plan`.
    pub plan: Option<crate::plan::PlanSwitch>,
    /// The server's view of the checkpointer (`deepagents serve`).
    pub watch: Option<Arc<deepagents_server::StepWatch>>,
}

/// Builds the agent the flags describe, for `front`; `may_ask` lets it ask on the terminal
/// whether to trust the project (not once the TUI owns the terminal).
pub async fn prepare(args: &RunArgs, front: Front, may_ask: bool) -> anyhow::Result<Session> {
    prepare_watched(args, front, may_ask, None).await
}

/// [`prepare`], for the server: every assistant checkpoints through one `watch` (made from
/// this one's checkpointer when `None`).
pub async fn prepare_watched(
    args: &RunArgs,
    front: Front,
    may_ask: bool,
    watch: Option<Arc<deepagents_server::StepWatch>>,
) -> anyhow::Result<Session> {
    prepare_layered(args, front, may_ask, watch, None).await
}

/// [`prepare`] with `layer` around the workspace's disk (`deepagents acp`: the editor's
/// buffers and terminal).
#[cfg_attr(not(feature = "acp"), allow(dead_code))]
pub async fn prepare_with_layer(
    args: &RunArgs,
    front: Front,
    layer: &dyn workspace::DiskLayer,
) -> anyhow::Result<Session> {
    prepare_layered(args, front, false, None, Some(layer)).await
}

async fn prepare_layered(
    args: &RunArgs,
    front: Front,
    may_ask: bool,
    watch: Option<Arc<deepagents_server::StepWatch>>,
    layer: Option<&dyn workspace::DiskLayer>,
) -> anyhow::Result<Session> {
    let config = config::load(args.config.as_deref())?;
    let (spec, model) = load_model(args, &config)?;
    // A local server may say its window (asked once, here, so the agent's thresholds use it).
    let window = match args.max_input_tokens {
        Some(window) => Some(window),
        None => model.resolve_profile().await.map(|p| p.max_input_tokens),
    };
    let mut builder = limited(Agent::builder(model), args, &config);
    let agent_dirs = agents::sources(args.root.as_deref(), &args.agent_dirs);
    let virtual_mode = args.virtual_mode.or(config.virtual_mode).unwrap_or(true);
    let sandbox_mode = args.sandbox.or(config.sandbox.mode).unwrap_or_default();
    let (workspace, permissions) =
        open_workspace(args, &config, front, (virtual_mode, sandbox_mode), layer).await?;
    let workspace::Workspace {
        backend,
        memory,
        skills,
        checkpointer,
        store,
        root,
        sandbox: policy,
    } = workspace;
    let shell = backend.as_sandbox().is_some();
    builder = builder.backend(backend).memory(memory).skills(skills);
    if let Some(root) = &root {
        builder = builder.middleware(local_context::LocalContext::new(root, virtual_mode));
    }
    if let Some(permissions) = permissions {
        builder = builder.permissions(permissions);
    }
    let confined = policy.is_some();
    let plan = (front == Front::Tui || args.plan).then(|| crate::plan::PlanSwitch::new(args.plan));
    if let Some(plan) = &plan {
        builder = builder.middleware(crate::plan::PlanMode::new(plan.clone()));
    }
    let gate = |config: InterruptConfig| match &plan {
        Some(plan) => crate::plan::unless_planning(config, plan),
        None => config,
    };
    let (rules, grants, manual) = approval_rules(args, &config, front, shell, policy, sandbox_mode);
    for (tool, rule) in rules {
        builder = builder.interrupt_on(tool, gate(rule));
    }
    if let Some(tokens) = args.max_input_tokens {
        builder = builder.context_window(tokens);
    }
    let (mut builder, subagents) = add_subagents(builder, &agent_dirs)?;
    if let Some(prompt) = args.system_prompt.clone() {
        builder = builder.system_prompt(prompt);
    }
    let (mut builder, watch) = checkpointing(builder, checkpointer, front, watch);
    if !args.auto_approve {
        for tool in &args.interrupt_on {
            builder = builder.interrupt_on(tool, gate(InterruptConfig::default()));
        }
    }
    let hooks_root = match &root {
        Some(root) => root.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let trusted = trust::project(&hooks_root, args.trust_project, may_ask)?;
    let Askers {
        approver,
        elicitor,
        questions,
    } = askers(front, args.auto_approve);
    let mcp_servers = if args.no_mcp {
        Vec::new()
    } else {
        let (servers, notes) = mcp::servers(&hooks_root, &args.mcp_config, trusted)?;
        for note in notes {
            eprintln!("{note}");
        }
        servers
    };
    // Hooks see the servers' tools by Claude Code's names too (`mcp__SERVER__TOOL`).
    let mcp_prefixes = mcp_servers
        .iter()
        .filter(|server| server.enabled)
        .map(|server| deepagents_mcp::tool_name(&server.name, ""));
    let (builder, front_hooks) =
        add_hooks(builder, args, &hooks_root, trusted, approver, mcp_prefixes)?;
    let ask = !args.auto_approve && front.can_approve();
    let (builder, mcp) = connect_mcp(builder, &mcp_servers, &hooks_root, elicitor, ask).await?;
    let agent = builder.ask_user(true).build().map_err(|error| match error {
        // Said with the flags and the config file that fix it.
        deepagents::BuildError::UnpricedCostCap { model } => anyhow::anyhow!(
            "a cost cap (--max-cost, or max_cost in [limits]) needs the model's prices, and none are known for `{model}`: give them in the config file ([models.\"{model}\"] prices = {{ input = …, output = … }}, dollars per million tokens), or cap its tokens instead (--max-tokens N)"
        ),
        error => error.into(),
    })?;
    Ok(Session {
        agent,
        model: spec,
        store,
        grants,
        hooks: front_hooks,
        sandbox: match (confined, sandbox_mode) {
            (_, sandbox::SandboxMode::Off) => "sandbox off".to_owned(),
            (true, _) => "sandboxed".to_owned(),
            (false, _) => String::new(),
        },
        mcp,
        root,
        questions,
        window,
        trusted,
        subagents,
        manual,
        plan,
        watch,
    })
}

/// The model the flags and the config file name, and its spec.
fn load_model(
    args: &RunArgs,
    config: &Config,
) -> anyhow::Result<(String, Arc<dyn deepagents::Model>)> {
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
    Ok((spec, model))
}

/// `builder` with the built-in tools the flags offer, and the run's limits and prices.
fn limited(builder: AgentBuilder, args: &RunArgs, config: &Config) -> AgentBuilder {
    let limits = deepagents::core::SpendLimits {
        max_cost_usd: args.max_cost.or(config.limits.max_cost),
        max_tokens: args.max_tokens.or(config.limits.max_tokens),
    };
    let mut builder = builder
        .todos(args.todos)
        .compact_tool(args.compact_tool)
        .max_turns(args.max_turns)
        .spend_limits(limits)
        .prices(config.price_book());
    if args.web_fetch {
        builder = builder.web_fetch_allowed_hosts(config.web_fetch.allowed_hosts.iter().cloned());
    }
    builder
}

/// The backend `--backend` and `--repo` ask for, and the repository when it is one.
fn backend_kind(
    args: &RunArgs,
    config: &Config,
) -> anyhow::Result<(
    workspace::BackendKind,
    Option<deepagents::backends::RepoBackend>,
)> {
    Ok(match (args.backend, &args.repo.repo) {
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
    })
}

/// Opens the workspace the flags describe (where files live, memory, skills, threads), under
/// the permission rules of `--permissions`, which are returned for the file tools.
async fn open_workspace(
    args: &RunArgs,
    config: &Config,
    front: Front,
    (virtual_mode, sandbox_mode): (bool, sandbox::SandboxMode),
    layer: Option<&dyn workspace::DiskLayer>,
) -> anyhow::Result<(workspace::Workspace, Option<Permissions>)> {
    let (backend, repo) = backend_kind(args, config)?;
    let permissions = args
        .permissions
        .as_deref()
        .map(workspace::permissions)
        .transpose()?;
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
            layer,
        },
    )
    .await?;
    Ok((workspace, permissions))
}

/// Which calls wait for approval: unconfined commands, confined ones that reach outside the
/// sandbox, and in the TUI's `/manual` every change — as (tool, rule) pairs. Also the grants
/// approvals make, and the TUI's switch.
fn approval_rules(
    args: &RunArgs,
    config: &Config,
    front: Front,
    shell: bool,
    policy: Option<deepagents::backends::sandbox::SharedPolicy>,
    sandbox_mode: sandbox::SandboxMode,
) -> (
    Vec<(&'static str, InterruptConfig)>,
    Option<deepagents::backends::sandbox::SharedPolicy>,
    Option<approvals::ManualSwitch>,
) {
    let mut rules = Vec::new();
    // `execute` is offered only by a backend with a shell; the builder refuses interrupts
    // for tools that are not offered. Confined commands need no approval: the sandbox is the
    // guard. Unconfined ones (`--sandbox off`) ask, but for those the allow-list names.
    if !args.auto_approve && sandbox_mode == sandbox::SandboxMode::Off && shell {
        let mut allowed = args.shell_allow.clone();
        allowed.extend(config.shell.allow.iter().cloned());
        rules.push(("execute", approvals::execute_config(allowed)));
    }
    // Confined commands that name something outside the sandbox ask, where someone can
    // answer; elsewhere they run confined and fail where the sandbox stops them.
    let grants = policy.filter(|_| !args.auto_approve && front.can_approve());
    // The TUI switches between asking before every change (`/manual`) and only before what
    // leaves the sandbox (`/auto`) while it runs.
    let manual = (matches!(front, Front::Tui | Front::Acp) && !args.auto_approve)
        .then(approvals::ManualSwitch::default);
    if let Some(manual) = &manual {
        for tool in approvals::FILE_CHANGES {
            rules.push((tool, approvals::manual_file_config(manual.clone())));
        }
        if args.web_fetch {
            rules.push((
                deepagents::WEB_FETCH,
                approvals::manual_fetch_config(manual.clone()),
            ));
        }
        if sandbox_mode != sandbox::SandboxMode::Off && shell {
            rules.push((
                "execute",
                approvals::manual_execute_config(manual.clone(), grants.clone()),
            ));
        }
    } else if let Some(policy) = &grants {
        rules.push(("execute", approvals::outside_config(policy.clone())));
    }
    (rules, grants, manual)
}

/// The subagents of `dirs` added to the built-in one; each name and description, for the
/// TUI.
fn add_subagents(
    mut builder: AgentBuilder,
    dirs: &[PathBuf],
) -> anyhow::Result<(AgentBuilder, Vec<(String, String)>)> {
    let mut subagents = vec![(
        "general-purpose".to_owned(),
        "the built-in helper: the main agent's tools, in a fresh context".to_owned(),
    )];
    for subagent in agents::load(dirs)? {
        subagents.push((
            subagent.name().to_owned(),
            subagent.description().to_owned(),
        ));
        builder = builder.subagent(subagent);
    }
    Ok((builder, subagents))
}

/// Where threads are saved: the workspace's checkpointer, which the server sees every step of
/// through its watch (`watch`, or one made here).
fn checkpointing(
    mut builder: AgentBuilder,
    checkpointer: Option<Arc<dyn deepagents::Checkpointer>>,
    front: Front,
    watch: Option<Arc<deepagents_server::StepWatch>>,
) -> (AgentBuilder, Option<Arc<deepagents_server::StepWatch>>) {
    let watch = match (&checkpointer, front) {
        (Some(checkpointer), Front::Server) => {
            Some(watch.unwrap_or_else(|| deepagents_server::StepWatch::new(checkpointer.clone())))
        }
        _ => None,
    };
    match (&watch, checkpointer) {
        (Some(watch), _) => builder = builder.checkpointer(watch.clone()),
        (None, Some(checkpointer)) => builder = builder.checkpointer(checkpointer),
        (None, None) => {}
    }
    (builder, watch)
}

/// Who answers what a run asks while it goes on: a hook's `ask`, an MCP server's question.
struct Askers {
    /// Decides hooks' `ask`; none refuses it.
    approver: Option<Arc<dyn deepagents::middleware::HookApprover>>,
    /// Answers MCP servers' questions while the call waits; without one a question suspends
    /// the call and the run pauses on it, like any tool's question.
    elicitor: Option<Arc<dyn deepagents_mcp::Elicitor>>,
    /// Where the TUI receives the questions both ask.
    questions: Option<tui::Questions>,
}

/// Who answers, for `front`.
fn askers(front: Front, auto_approve: bool) -> Askers {
    match front {
        Front::Headless => Askers {
            approver: hooks::headless_approver(auto_approve),
            elicitor: mcp::headless_elicitor(auto_approve),
            questions: None,
        },
        // Nobody at a terminal: hooks' `ask` is refused unless everything is approved, and
        // MCP servers' questions suspend their call: the client answers them as the run's
        // interrupt (a LangGraph `Command(resume=...)`, an ACP permission request).
        Front::Server | Front::Acp => Askers {
            approver: auto_approve.then(hooks::always),
            elicitor: None,
            questions: None,
        },
        Front::Tui => {
            let (asker, questions) = tui::Asker::channel();
            let asker = Arc::new(asker);
            let approver: Arc<dyn deepagents::middleware::HookApprover> = if auto_approve {
                hooks::always()
            } else {
                asker.clone()
            };
            Askers {
                approver: Some(approver),
                elicitor: Some(asker),
                questions: Some(questions),
            }
        }
    }
}

/// The hooks of the user, the project (when `trusted`) and `--hooks`; also returned for the
/// front end to fire its own events, when there are any.
fn add_hooks(
    mut builder: AgentBuilder,
    args: &RunArgs,
    root: &Path,
    trusted: bool,
    approver: Option<Arc<dyn deepagents::middleware::HookApprover>>,
    mcp_prefixes: impl IntoIterator<Item = String>,
) -> anyhow::Result<(AgentBuilder, Option<deepagents::middleware::Hooks>)> {
    let (hooks, notes) = hooks::load(root, &args.hook_files, trusted, approver)?;
    let hooks = hooks.mcp_tool_prefixes(mcp_prefixes);
    for note in notes {
        eprintln!("{note}");
    }
    let front_hooks = (!hooks.is_empty()).then(|| hooks.clone());
    if !hooks.is_empty() {
        builder = builder.hooks(hooks);
    }
    Ok((builder, front_hooks))
}

/// Starts the MCP servers the run uses and offers their tools; with `ask`, the tools their
/// server marks destructive wait for approval.
async fn connect_mcp(
    mut builder: AgentBuilder,
    servers: &[deepagents_mcp::ServerConfig],
    root: &Path,
    elicitor: Option<Arc<dyn deepagents_mcp::Elicitor>>,
    ask: bool,
) -> anyhow::Result<(AgentBuilder, Option<deepagents_mcp::Connections>)> {
    if servers.is_empty() {
        return Ok((builder, None));
    }
    let connections = mcp::connect(servers, root, elicitor).await;
    for problem in connections.tools().1 {
        eprintln!("warning: an MCP tool was left out: {problem}");
    }
    // A source rather than fixed tools: servers that announce `list_changed` get their
    // tools listed again before the next model call.
    builder = builder.tool_source(connections.tool_source());
    // Tools their server marks destructive ask first, where someone can answer.
    if ask {
        for name in connections.destructive_tools() {
            builder = builder.interrupt_on(
                name,
                InterruptConfig {
                    description: Some("Its MCP server marks this tool as destructive.".to_owned()),
                    ..InterruptConfig::default()
                },
            );
        }
    }
    Ok((builder, Some(connections)))
}
