//! The subcommands that need no agent: `repo`, `mcp`, `sandbox` and `completions`.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::CommandFactory as _;

use crate::args::{Cli, McpCommand, McpSources, RepoCommand, SandboxCommand};
use crate::{config, mcp, sandbox, shutdown, workspace};

/// `deepagents repo …`.
pub async fn repo_command(command: RepoCommand) -> anyhow::Result<ExitCode> {
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

/// `deepagents mcp …`; a signal drops it, and the servers it started with it.
pub async fn mcp_command(command: McpCommand) -> anyhow::Result<ExitCode> {
    shutdown::or_signal(mcp_listing(command))
        .await
        .unwrap_or_else(|signal| Ok(ExitCode::from(signal.exit_code())))
}

/// Lists the servers or their tools.
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

/// `deepagents sandbox …`, with the `[sandbox]` section of the config file.
pub async fn sandbox_command(command: SandboxCommand) -> anyhow::Result<ExitCode> {
    match command {
        SandboxCommand::Check {
            root,
            sandbox_engine,
            config,
        } => config::load(config.as_deref())
            .and_then(|config| sandbox::check(root, sandbox_engine, &config.sandbox)),
        SandboxCommand::Run {
            root,
            sandbox: mode,
            sandbox_engine,
            config,
            command,
        } => {
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
    }
}

/// `deepagents completions SHELL`: the completion script for `shell`, generated from the
/// command line's definition so it always offers the flags this binary has.
pub fn completions(shell: clap_complete::Shell) -> anyhow::Result<ExitCode> {
    // Generated into memory first: the generator panics on a failed write (a closed pipe),
    // where writing it out ourselves reports the error.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "deepagents", &mut script);
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&script)
        .and_then(|()| stdout.flush())
        .context("cannot write the completion script")?;
    Ok(ExitCode::SUCCESS)
}
