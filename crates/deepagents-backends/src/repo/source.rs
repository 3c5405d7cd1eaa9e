//! Which repository a source string names, and which branch to use.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use super::git::{GitError, Location};
use crate::protocol::BackendError;

/// The branch of a repository that has none yet.
const FIRST_BRANCH: &str = "main";

fn invalid(message: String) -> BackendError {
    BackendError::InvalidQuery {
        what: "repository",
        message,
    }
}

/// The repository `source` names:
///
/// - `file://PATH` and anything starting with `/`, `./`, `../` or `~/` is a local path;
/// - `SCHEME://…` and `[user@]host:path` (as git reads them) are remote;
/// - anything else (`owner/name`, `name`) is joined to `base` when there is one, and is a
///   local path otherwise.
///
/// Relative paths are taken from the current directory. For a repository linked from another
/// (`relative_to`), `./` and `../` paths are resolved against that repository as git resolves
/// submodule URLs (`../skill.git` is its sibling), and a bare name without a base is its
/// sibling too.
pub(crate) fn resolve(
    source: &str,
    base: Option<&str>,
    relative_to: Option<&Location>,
) -> Result<Location, BackendError> {
    let source = source.trim();
    if source.is_empty() {
        return Err(invalid(
            "the repository is empty; give a path or a URL".to_owned(),
        ));
    }
    // git would read a leading `-` as an option.
    if source.starts_with('-') {
        return Err(invalid(format!(
            "`{source}` starts with `-`; write a path as ./{source}"
        )));
    }
    if let Some(path) = source.strip_prefix("file://") {
        return Ok(Location::Local(PathBuf::from(path)));
    }
    if source.contains("://") || is_scp_like(source) {
        return Ok(Location::Remote(source.to_owned()));
    }
    let explicit_path = source.starts_with('/')
        || source.starts_with("./")
        || source.starts_with("../")
        || source == "."
        || source == ".."
        || source.starts_with("~/");
    if !explicit_path && let Some(base) = base {
        let joined = format!("{}/{}", base.trim_end_matches('/'), source);
        return resolve(&joined, None, None);
    }
    if let Some(home_relative) = source.strip_prefix("~/") {
        let home = std::env::var_os("HOME")
            .ok_or_else(|| invalid(format!("`{source}` needs HOME, which is not set")))?;
        return Ok(Location::Local(Path::new(&home).join(home_relative)));
    }
    let path = Path::new(source);
    if path.is_absolute() {
        return Ok(Location::Local(path.to_path_buf()));
    }
    // As git resolves a submodule's `./` and `../` URLs: against the linking repository
    // itself, so `../skill.git` is its sibling. A bare name is a sibling too.
    let against_repo = explicit_path;
    match relative_to {
        Some(Location::Local(repo)) => {
            let dir = if against_repo {
                repo.as_path()
            } else {
                repo.parent().unwrap_or(Path::new("/"))
            };
            Ok(Location::Local(normalize_path(&dir.join(path))))
        }
        Some(Location::Remote(url)) => {
            let url = url.trim_end_matches('/');
            let dir = if against_repo {
                url
            } else {
                url.rsplit_once('/').map_or(url, |(parent, _)| parent)
            };
            Ok(Location::Remote(normalize_url(&format!("{dir}/{source}"))))
        }
        None => {
            let cwd = std::env::current_dir().map_err(|e| {
                invalid(format!(
                    "cannot read the current directory ({e}) to find `{source}`"
                ))
            })?;
            Ok(Location::Local(normalize_path(&cwd.join(path))))
        }
    }
}

/// Drops `.` and folds `..` segments without touching the disk (the path may not exist yet).
fn normalize_path(path: &Path) -> PathBuf {
    let mut normalized = PathBuf::new();
    for component in path.components() {
        match component {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                normalized.pop();
            }
            other => normalized.push(other),
        }
    }
    normalized
}

/// `host:path` as git reads it: a colon before any slash, and not a drive letter.
fn is_scp_like(source: &str) -> bool {
    match (source.find(':'), source.find('/')) {
        (Some(colon), slash) => colon > 1 && slash.is_none_or(|slash| colon < slash),
        (None, _) => false,
    }
}

/// Resolves `.` and `..` segments in the path part of a URL.
fn normalize_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "." | "" => {}
            ".." => {
                segments.pop();
            }
            other => segments.push(other),
        }
    }
    format!("{scheme}://{host}/{}", segments.join("/"))
}

/// Refuses branch names git would misread or refuse later.
pub(crate) fn check_branch(branch: &str) -> Result<(), BackendError> {
    let bad = branch.is_empty()
        || branch.starts_with('-')
        || branch.starts_with('/')
        || branch.ends_with('/')
        || branch.ends_with('.')
        || branch.ends_with(".lock")
        || branch.contains("..")
        || branch.contains("//")
        || branch.contains("@{")
        || branch
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || "~^:?*[\\".contains(c));
    if bad {
        return Err(BackendError::InvalidQuery {
            what: "branch",
            message: format!("`{branch}` is not a valid branch name"),
        });
    }
    Ok(())
}

/// The branch the repository's HEAD names; [`FIRST_BRANCH`] for a repository that does not
/// exist yet or has no commit.
pub(crate) async fn default_branch(location: &Location) -> Result<String, GitError> {
    let target = match location {
        Location::Local(path) if !path.exists() => return Ok(FIRST_BRANCH.to_owned()),
        other => other.to_string(),
    };
    let output = Command::new("git")
        .args(["ls-remote", "--symref", "--", &target, "HEAD"])
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(GitError::Spawn)?;
    if !output.status.success() {
        return Err(GitError::Failed {
            command: "ls-remote".to_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    let listing = String::from_utf8_lossy(&output.stdout);
    let branch = listing.lines().find_map(|line| {
        let target = line.strip_prefix("ref: refs/heads/")?;
        let (branch, what) = target.split_once('\t')?;
        (what == "HEAD").then(|| branch.to_owned())
    });
    Ok(branch.unwrap_or_else(|| FIRST_BRANCH.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(path: &str) -> Location {
        Location::Local(PathBuf::from(path))
    }

    #[test]
    fn sources_resolve_as_documented() {
        let remote = |s: &str| Location::Remote(s.to_owned());
        assert_eq!(
            resolve("/srv/a.git", None, None).ok(),
            Some(local("/srv/a.git"))
        );
        assert_eq!(
            resolve("file:///srv/a", None, None).ok(),
            Some(local("/srv/a"))
        );
        assert_eq!(
            resolve("git@github.com:acme/a.git", None, None).ok(),
            Some(remote("git@github.com:acme/a.git"))
        );
        assert_eq!(
            resolve("acme/a", Some("https://git.example.com/"), None).ok(),
            Some(remote("https://git.example.com/acme/a"))
        );
        assert_eq!(
            resolve("acme/a", Some("/srv/repos"), None).ok(),
            Some(local("/srv/repos/acme/a"))
        );
        assert_eq!(
            resolve("../skill.git", None, Some(&local("/srv/agent.git"))).ok(),
            Some(local("/srv/skill.git"))
        );
        assert_eq!(
            resolve("skill.git", None, Some(&local("/srv/agent.git"))).ok(),
            Some(local("/srv/skill.git"))
        );
        assert_eq!(
            resolve(
                "../skill",
                None,
                Some(&remote("https://h.example/acme/agent"))
            )
            .ok(),
            Some(remote("https://h.example/acme/skill"))
        );
        assert_eq!(
            resolve(
                "acme/skill",
                Some("https://h.example"),
                Some(&remote("https://x/y"))
            )
            .ok(),
            Some(remote("https://h.example/acme/skill"))
        );
        assert!(resolve("--upload-pack=x", None, None).is_err());
        assert!(resolve("  ", None, None).is_err());
    }

    #[test]
    fn branch_names_git_would_refuse_are_refused() {
        for bad in ["", "-f", "a..b", "a b", "x.lock", "a:b", "a~1", "/a", "a/"] {
            assert!(check_branch(bad).is_err(), "{bad:?}");
        }
        for good in ["main", "release/1.2", "feature-x"] {
            assert!(check_branch(good).is_ok(), "{good:?}");
        }
    }
}
