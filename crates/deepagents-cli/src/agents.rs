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

#[cfg(test)]
mod tests {
    use deepagents::SubAgentMode;

    use super::load;

    #[test]
    fn frontmatter_mode_fork_makes_a_fork_and_an_unknown_mode_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("twin.md"),
            "---\nname: twin\ndescription: Continues the conversation.\nmode: fork\n---\nAlso check the tests.\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("solo.md"),
            "---\nname: solo\ndescription: Works alone.\n---\nYou work alone.\n",
        )
        .unwrap();
        let loaded = load(&[dir.path().to_path_buf()]).unwrap();
        let modes: Vec<(&str, SubAgentMode)> = loaded
            .iter()
            .map(|s| (s.name(), s.context_mode()))
            .collect();
        assert_eq!(
            modes,
            [
                ("solo", SubAgentMode::Isolated),
                ("twin", SubAgentMode::Fork)
            ]
        );

        std::fs::write(
            dir.path().join("bad.md"),
            "---\nname: bad\ndescription: d\nmode: forked\n---\nPrompt.\n",
        )
        .unwrap();
        let error = format!(
            "{:#}",
            load(&[dir.path().to_path_buf()]).err().expect("refused")
        );
        assert!(error.contains("bad.md"), "{error}");
        assert!(error.contains("invalid subagent mode `forked`"), "{error}");
    }
}
