//! The filesystem tools and their prompt section.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use deepagents_backends::Backend;
use deepagents_core::RunContext;
use deepagents_core::{AgentState, DynTool, ModelRequest, TypedTool};

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
}

impl FilesystemMiddleware {
    /// File tools over `backend`.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        let shell_paths = shell_paths_section(backend.as_ref());
        Self {
            backend,
            shell_paths,
        }
    }
}

/// When the shell and the file tools see different trees, says how each virtual prefix maps
/// to the host, and which cannot be reached from the shell. Nothing is said when both see the
/// same tree (a non-virtual disk, or a sandbox whose files are its own).
fn shell_paths_section(backend: &dyn Backend) -> Option<String> {
    backend.as_sandbox()?;
    // The harness's own directories are explained with the file tools; listing them here
    // would only repeat that the shell cannot reach them.
    let harness_dirs = [super::LARGE_RESULTS_DIR, super::HISTORY_DIR];
    let mappings: Vec<_> = backend
        .path_mappings()
        .into_iter()
        .filter(|m| m.host.is_some() || !harness_dirs.contains(&m.prefix.as_str()))
        .collect();
    if let [only] = mappings.as_slice() {
        let host = only
            .host
            .as_ref()
            .filter(|host| host.as_path() != Path::new("/"))?;
        if !only.prefix.is_root() {
            return None;
        }
        // A disk confined to its root: the shell's `/` is the host's, not the file tools'.
        let host = host.display();
        return Some(format!(
            "## Shell paths vs file paths\nThe shell sees the host's disk, where file path `/` is \
             `{host}`, the shell's working directory: the file tools' `/src/main.rs` is \
             `{host}/src/main.rs`, or `src/main.rs`, in a command."
        ));
    }
    if mappings.len() < 2 {
        return None;
    }
    let mut section = String::from(
        "## Shell paths vs file paths\nThe file tools and the shell see different trees. File-tool paths map to the shell like this:",
    );
    for mapping in &mappings {
        let prefix = if mapping.prefix.is_root() {
            "/".to_owned()
        } else {
            format!("{}/", mapping.prefix)
        };
        match &mapping.host {
            Some(host) => section.push_str(&format!(
                "\n- `{prefix}` is `{}` in the shell",
                host.display()
            )),
            None => section.push_str(&format!(
                "\n- `{prefix}` is not on the shell's disk; use the file tools for it"
            )),
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
            Arc::new(TypedTool::new(ReadFile(b()))),
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
