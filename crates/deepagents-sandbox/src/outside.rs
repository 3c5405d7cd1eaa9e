//! What a command names that its policy does not give it: host paths it cannot see and
//! hosts it cannot reach, found in the command's text before it runs, so a front end can
//! ask for them (with the reason) instead of letting the command fail inside the sandbox;
//! and [`SharedPolicy`], a policy that such approvals widen for the rest of a session.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::proxy::DomainRules;
use crate::{Network, Policy};

/// One thing outside the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outside {
    /// A host path the command cannot see.
    Path(PathBuf),
    /// A host the command cannot reach over the network.
    Host(String),
}

impl std::fmt::Display for Outside {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Path(path) => write!(f, "{}", path.display()),
            Self::Host(host) => write!(f, "the network ({host})"),
        }
    }
}

impl Policy {
    /// Paths and hosts `command` names that this policy does not give it: absolute paths
    /// (and `~/…`) that exist on the host outside every visible path, and hosts of
    /// `http(s)://` URLs the network does not reach. A heuristic over the text: it catches
    /// what a command names, not what a program decides at run time.
    pub fn outside(&self, command: &str) -> Vec<Outside> {
        let mut found = Vec::new();
        for word in words(command) {
            let item = if let Some(host) = url_host(&word) {
                self.unreachable(&host).then_some(Outside::Host(host))
            } else {
                host_path(&word)
                    .and_then(|path| self.invisible(&path))
                    .map(Outside::Path)
            };
            if let Some(item) = item.filter(|item| !found.contains(item)) {
                found.push(item);
            }
        }
        found
    }

    /// Gives commands what `items` name: paths become extra writable paths, hosts allowed
    /// domains (turning a network that was off into one that reaches only them).
    pub fn grant(&mut self, items: &[Outside]) {
        for item in items {
            match item {
                Outside::Path(path) => {
                    if !self.extra_write.contains(path) {
                        self.extra_write.push(path.clone());
                    }
                }
                Outside::Host(host) => match &mut self.network {
                    Network::Off => self.network = Network::Domains(vec![host.clone()]),
                    Network::Domains(domains) if !domains.contains(host) => {
                        domains.push(host.clone());
                    }
                    Network::Domains(_) | Network::On => {}
                },
            }
        }
    }

    fn unreachable(&self, host: &str) -> bool {
        match &self.network {
            Network::On => false,
            Network::Off => true,
            Network::Domains(domains) => DomainRules::new(domains).matches(host).is_none(),
        }
    }

    /// Whether commands see host path `path` (absolute): under the root, a system or extra
    /// path, `/dev`, `/proc`, or `/tmp` (the sandbox's own).
    pub fn shows(&self, path: &Path) -> bool {
        self.invisible(path).is_none()
    }

    /// The path to ask for when `path` (absolute) is not visible: the path itself when it
    /// exists, else its nearest existing ancestor; `None` when it is visible, or when nothing
    /// of it exists but `/`. A path under `/tmp` counts only when it exists on the host: the
    /// sandbox's `/tmp` is its own, where a command makes what it likes.
    fn invisible(&self, path: &Path) -> Option<PathBuf> {
        let existing = path.ancestors().find(|a| a.exists())?;
        let resolved = existing.canonicalize().ok()?;
        if resolved == Path::new("/") || resolved == Path::new("/tmp") {
            return None;
        }
        let covers = |allowed: &Path| {
            resolved.starts_with(allowed)
                || allowed
                    .canonicalize()
                    .is_ok_and(|allowed| resolved.starts_with(allowed))
        };
        let root = self
            .root
            .canonicalize()
            .unwrap_or_else(|_| self.root.clone());
        let visible = self
            .system
            .iter()
            .chain(&self.extra_read)
            .chain(&self.extra_write)
            .map(PathBuf::as_path)
            .chain([Path::new("/dev"), Path::new("/proc"), root.as_path()])
            .any(covers);
        let sandbox_tmp = resolved.starts_with("/tmp") && existing != path;
        (!visible && !sandbox_tmp).then_some(resolved)
    }
}

/// The command's words, split at blanks and shell punctuation, quotes dropped, and the value
/// of `--option=VALUE` as a word of its own.
fn words(command: &str) -> Vec<String> {
    command
        .split(|c: char| c.is_whitespace() || ";|&<>()`'\"".contains(c))
        .filter(|word| !word.is_empty())
        .map(|word| {
            word.split_once('=')
                .map_or(word, |(_, value)| value)
                .to_owned()
        })
        .collect()
}

/// The host of an `http://` or `https://` URL.
fn url_host(word: &str) -> Option<String> {
    let rest = word
        .strip_prefix("http://")
        .or_else(|| word.strip_prefix("https://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => authority.split(':').next()?,
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// An absolute host path a word names (`~/` is the host's home).
fn host_path(word: &str) -> Option<PathBuf> {
    if let Some(rest) = word.strip_prefix("~/") {
        return std::env::home_dir().map(|home| home.join(rest));
    }
    word.starts_with('/').then(|| PathBuf::from(word))
}

/// A policy shared by the commands of a session, which approvals widen.
#[derive(Clone, Debug)]
pub struct SharedPolicy(Arc<RwLock<Policy>>);

impl SharedPolicy {
    /// Shares `policy`.
    pub fn new(policy: Policy) -> Self {
        Self(Arc::new(RwLock::new(policy)))
    }

    /// The policy as it is now.
    pub fn get(&self) -> Policy {
        match self.0.read() {
            Ok(policy) => policy.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// What `command` names outside the policy as it is now.
    pub fn outside(&self, command: &str) -> Vec<Outside> {
        self.get().outside(command)
    }

    /// Gives every later command what `items` name.
    pub fn grant(&self, items: &[Outside]) {
        let mut policy = match self.0.write() {
            Ok(policy) => policy,
            Err(poisoned) => poisoned.into_inner(),
        };
        policy.grant(items);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_name_paths_and_hosts_outside_the_policy() {
        let outside_dir =
            std::env::temp_dir().join(format!("deepagents-outside-{}", std::process::id()));
        let root = outside_dir.join("root");
        let other = outside_dir.join("other");
        let _ = std::fs::create_dir_all(&root);
        let _ = std::fs::create_dir_all(&other);
        let policy = Policy::workspace_write(&root);
        let other_c = other.canonicalize().unwrap_or(other.clone());
        let root_c = root.canonicalize().unwrap_or(root.clone());
        let found = Policy {
            root: root_c.clone(),
            ..policy.clone()
        }
        .outside(&format!(
            "cat {}/x.txt /usr/bin/env {root}/a; curl -s https://user@Example.com:8443/p --data=@{other}/f http://[::1]/; ls /nonexistent/thing",
            other_c.display(),
            root = root_c.display(),
            other = other_c.display()
        ));
        // Under /tmp the paths are the sandbox's own: not asked for.
        assert!(
            found.iter().all(|item| !matches!(item, Outside::Path(_))),
            "{found:?}"
        );
        assert_eq!(
            found,
            vec![
                Outside::Host("example.com".into()),
                Outside::Host("::1".into())
            ]
        );
        let mut granted = policy.clone();
        granted.grant(&[
            Outside::Host("example.com".into()),
            Outside::Path(other_c.clone()),
        ]);
        assert_eq!(
            granted.network,
            Network::Domains(vec!["example.com".into()])
        );
        assert_eq!(granted.extra_write, vec![other_c]);
        assert!(granted.outside("curl https://example.com/").is_empty());
        let _ = std::fs::remove_dir_all(&outside_dir);
    }

    #[test]
    fn paths_outside_every_visible_one_are_found() {
        let policy = Policy::workspace_write("/usr/share");
        let home = std::env::home_dir().unwrap_or_else(|| PathBuf::from("/root"));
        let found = policy.outside("cat ~/.bashrc /etc/hostname /usr/share/x");
        if home.exists() && !home.starts_with("/usr") {
            assert_eq!(found.len(), 1, "{found:?}");
            assert!(
                matches!(&found[0], Outside::Path(p) if p.starts_with(home.canonicalize().unwrap_or(home.clone()))),
                "{found:?}"
            );
        }
    }
}
