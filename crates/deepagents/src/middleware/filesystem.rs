//! The filesystem tools and their prompt section.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use deepagents_backends::Backend;
use deepagents_core::RunContext;
use deepagents_core::event::EventKind;
use deepagents_core::{AgentState, DynTool, ModelRequest, StateUpdate, TypedTool};

use super::{Middleware, MiddlewareError};
use crate::tools::execute::Execute;
use crate::tools::filesystem::{Delete, EditFile, Glob, Grep, Ls, ReadFile, WriteFile};

const FILES_PROMPT: &str = "\
## Files
You work on a filesystem of absolute paths starting with `/`. Find files with ls and glob, \
search contents with grep, read a file before changing it, use edit_file for targeted changes \
and write_file for new files. Results too large to return whole are saved under \
/large_tool_results/; page through them with read_file.";

const SHELL_PROMPT: &str = "\
## Shell
execute runs shell commands in the workspace directory. Use it to build, test and run \
programs; use the file tools to read and edit files.";

/// Offers `ls`, `read_file`, `write_file`, `edit_file`, `delete`, `glob`, `grep`, and `execute`
/// when the backend has a shell. Its name is `filesystem`.
pub struct FilesystemMiddleware {
    backend: Arc<dyn Backend>,
    shell_paths: Option<String>,
    /// `read_file`'s page cap in characters.
    page_chars: usize,
}

impl FilesystemMiddleware {
    /// File tools over `backend`.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        let shell_paths = shell_paths_section(backend.as_ref());
        Self {
            backend,
            shell_paths,
            page_chars: crate::tools::filesystem::page_chars(
                crate::context::FALLBACK_CONTEXT_TOKENS,
            ),
        }
    }

    /// Sizes `read_file`'s pages for a model whose window holds `tokens`: a quarter of it, at
    /// most 80,000 characters (what larger windows get).
    #[must_use]
    pub fn with_context_window(mut self, tokens: u64) -> Self {
        self.page_chars = crate::tools::filesystem::page_chars(tokens);
        self
    }
}

/// When the shell and the file tools see different trees, says how each virtual prefix maps
/// to the host, and which cannot be reached from the shell. Nothing is said when both see the
/// same tree (a non-virtual disk, or a sandbox whose files are its own).
///
/// Routes fall in three classes, each listed sorted: mapped to a host directory (a confined
/// disk route, at its root), mapped to the host's root (a non-virtual disk route: the prefix is
/// dropped), and not reachable (state, store, and every route when the default backend's shell
/// does not run on this host, as with a remote sandbox).
fn shell_paths_section(backend: &dyn Backend) -> Option<String> {
    let sandbox = backend.as_sandbox()?;
    let mappings = backend.path_mappings();
    // The shell runs where the default backend's files are: on this host only if they are.
    let shell_root = mappings
        .iter()
        .find(|m| m.prefix.is_root())
        .and_then(|m| m.host.clone());
    // The harness's own directories are explained with the file tools; listing them here
    // would only repeat that the shell cannot reach them.
    let harness_dirs = [super::LARGE_RESULTS_DIR, super::HISTORY_DIR];
    let mut routes: Vec<(String, Option<std::path::PathBuf>)> = mappings
        .iter()
        .filter(|m| !m.prefix.is_root())
        .filter(|m| m.host.is_some() || !harness_dirs.contains(&m.prefix.as_str()))
        .map(|m| {
            // A host directory the sandbox hides is as unreachable as one not on the host.
            let host = m
                .host
                .clone()
                .filter(|host| shell_root.is_some() && sandbox.shows_host_path(host));
            (format!("{}/", m.prefix), host)
        })
        .collect();
    routes.sort();
    routes.dedup_by(|a, b| a.0 == b.0);
    let confined_root = shell_root
        .as_ref()
        .filter(|host| host.as_path() != Path::new("/"))
        .map(|host| host.display().to_string());
    if routes.is_empty() {
        // A disk confined to its root: the shell's `/` is the host's, not the file tools'.
        let host = confined_root?;
        return Some(format!(
            "## Shell paths vs file paths\nThe shell sees the host's disk, where file path `/` is \
             `{host}`, the shell's working directory: the file tools' `/src/main.rs` is \
             `{host}/src/main.rs`, or `src/main.rs`, in a command."
        ));
    }
    let mut section = String::from(if shell_root.is_some() {
        "## Shell paths vs file paths\nThe shell sees this machine's files, not the file tools' \
         tree. Before using a file-tool path in a command, replace its prefix as listed here; \
         never pass a file-tool path to the shell unchanged."
    } else {
        "## Shell paths vs file paths\nThe shell runs in its own environment: the routes \
         listed here are not in its filesystem, so never pass their paths to a command."
    });
    if let Some(host) = &confined_root {
        section.push_str(&format!(
            "\n\nEverything not listed below: `/` is `{host}`, the shell's working directory \
             (`/src/main.rs` → `{host}/src/main.rs`)."
        ));
    }
    let example = |prefix: &str, host: &str| {
        let host = host.trim_end_matches('/');
        format!("- `{prefix}` → `{host}/` (`{prefix}dir/x.py` → `{host}/dir/x.py`)")
    };
    let to_dirs: Vec<String> = routes
        .iter()
        .filter_map(|(prefix, host)| {
            let host = host.as_ref().filter(|h| h.as_path() != Path::new("/"))?;
            Some(example(prefix, &host.display().to_string()))
        })
        .collect();
    let to_root: Vec<String> = routes
        .iter()
        .filter(|(_, host)| host.as_deref() == Some(Path::new("/")))
        .map(|(prefix, _)| example(prefix, "/"))
        .collect();
    let unreachable: Vec<String> = routes
        .iter()
        .filter(|(_, host)| host.is_none())
        .map(|(prefix, _)| format!("- `{prefix}`"))
        .collect();
    for (title, lines) in [
        ("Mapped to host directories:", to_dirs),
        ("Mapped to the host's root (drop the prefix):", to_root),
        (
            "Not reachable from the shell (use the file tools for them):",
            unreachable,
        ),
    ] {
        if !lines.is_empty() {
            section.push_str(&format!("\n\n{title}\n{}", lines.join("\n")));
        }
    }
    Some(section)
}

#[async_trait]
impl Middleware for FilesystemMiddleware {
    fn name(&self) -> &str {
        "filesystem"
    }

    fn tools(&self) -> Vec<Arc<dyn DynTool>> {
        let b = || Arc::clone(&self.backend);
        let mut tools: Vec<Arc<dyn DynTool>> = vec![
            Arc::new(TypedTool::new(Ls(b()))),
            Arc::new(TypedTool::new(ReadFile(b(), self.page_chars))),
            Arc::new(TypedTool::new(WriteFile(b()))),
            Arc::new(TypedTool::new(EditFile(b()))),
            Arc::new(TypedTool::new(Delete(b()))),
            Arc::new(TypedTool::new(Glob(b()))),
            Arc::new(TypedTool::new(Grep(b()))),
        ];
        if self.backend.as_sandbox().is_some() {
            tools.push(Arc::new(TypedTool::new(Execute(b()))));
        }
        tools
    }

    async fn before_run(
        &self,
        ctx: &RunContext,
        _state: &AgentState,
    ) -> Result<StateUpdate, MiddlewareError> {
        if let Some(confinement) = self.backend.as_sandbox().and_then(|s| s.confinement()) {
            ctx.events.emit(EventKind::Sandbox { confinement });
        }
        Ok(StateUpdate::default())
    }

    async fn before_model(
        &self,
        _ctx: &RunContext,
        request: &mut ModelRequest,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        request.push_system_section(FILES_PROMPT);
        if self.backend.as_sandbox().is_some() {
            request.push_system_section(SHELL_PROMPT);
        }
        if let Some(section) = &self.shell_paths {
            request.push_system_section(section);
        }
        Ok(())
    }
}
