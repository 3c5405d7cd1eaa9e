//! Which `hooks.json` files a run uses: the user's (`~/.deepagents/hooks.json`), the
//! project's (`.deepagents/hooks.json` in the root, only when trusted: it runs commands
//! someone else may have written), then each `--hooks FILE`, all of them, in that order.

use std::path::{Path, PathBuf};

use deepagents::middleware::Hooks;

/// The hooks of a run in `root`, and the notes to print about files skipped.
pub fn load(
    root: &Path,
    files: &[PathBuf],
    trust_project: bool,
) -> anyhow::Result<(Hooks, Vec<String>)> {
    let mut hooks = Hooks::default();
    let mut notes = Vec::new();
    let user = std::env::var_os("HOME").map(|home| Path::new(&home).join(".deepagents/hooks.json"));
    if let Some(user) = user.filter(|path| path.is_file()) {
        hooks = hooks.merge(Hooks::load(&user)?);
    }
    let project = root.join(".deepagents/hooks.json");
    if project.is_file() {
        if trust_project {
            hooks = hooks.merge(Hooks::load(&project)?);
        } else {
            notes.push(format!(
                "note: the project's hooks ({}) were not run: they run commands from the project; pass --trust-project to run them",
                project.display()
            ));
        }
    }
    for file in files {
        hooks = hooks.merge(Hooks::load(file)?);
    }
    Ok((hooks.in_dir(root), notes))
}
