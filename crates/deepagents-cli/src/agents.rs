//! Subagents defined in markdown files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use deepagents::SubAgent;

/// Where subagent definitions are looked up, lowest precedence first: the project's
/// `.deepagents/agents/` under `root` (`--root`, else the current directory) when it exists,
/// then each `--agents DIR` in order.
pub fn sources(root: Option<&Path>, explicit: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let project = root.unwrap_or(Path::new(".")).join(".deepagents/agents");
    if project.is_dir() {
        dirs.push(project);
    }
    dirs.extend(explicit.iter().cloned());
    dirs
}

/// Loads every `*.md` file of `dirs`; a later definition replaces an earlier one of the same
/// name.
pub fn load(dirs: &[PathBuf]) -> anyhow::Result<Vec<SubAgent>> {
    let mut by_name: BTreeMap<String, SubAgent> = BTreeMap::new();
    for dir in dirs {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read the subagent directory {}", dir.display()))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
            .collect();
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let subagent = SubAgent::from_markdown(&file.display().to_string(), &text)?;
            by_name.insert(subagent.name().to_owned(), subagent);
        }
    }
    Ok(by_name.into_values().collect())
}
