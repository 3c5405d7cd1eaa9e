//! One repository reached through the git binary.
//!
//! The backend never checks a work tree out: it keeps a private bare mirror, reads trees and
//! blobs from it with `ls-tree` and `cat-file --batch`, builds each commit with a throwaway
//! index (`read-tree`, `update-index`, `write-tree`, `commit-tree`) and pushes it without
//! force, so a branch that moved since it was read refuses the push. The git binary, rather
//! than a library, because it is on every machine that has the repositories, it speaks every
//! transport and credential helper the user has configured, and pushing is what the pure-Rust
//! library does not do yet.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};

use deepagents_core::FileData;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::memory::file_data;
use crate::path::VPath;

/// Why a git command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GitError {
    /// The binary could not be started.
    #[error("cannot run git ({0}); install git and put it on PATH")]
    Spawn(#[source] std::io::Error),
    /// It ran and failed.
    #[error("git {command} failed: {stderr}")]
    Failed {
        /// The subcommand.
        command: String,
        /// What it printed on stderr, trimmed.
        stderr: String,
    },
    /// Its output was not what this module expects of it.
    #[error("git {command} printed something unexpected: {detail}")]
    Unexpected {
        /// The subcommand.
        command: String,
        /// What was wrong.
        detail: String,
    },
}

/// Where a repository lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Location {
    /// A directory on this machine (a missing one is created on the first write).
    Local(PathBuf),
    /// Anything git can reach by URL (`https://`, `ssh://`, `user@host:path`).
    Remote(String),
}

impl Location {
    fn arg(&self) -> String {
        match self {
            Self::Local(path) => path.display().to_string(),
            Self::Remote(url) => url.clone(),
        }
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.arg())
    }
}

/// Who commits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Signature {
    pub name: String,
    pub email: String,
}

/// A commit that touched a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoCommit {
    /// The full commit id.
    pub id: String,
    /// The author's name.
    pub author: String,
    /// The author's email.
    pub email: String,
    /// Author time, seconds since the Unix epoch.
    pub time: i64,
    /// The first line of the message.
    pub summary: String,
}

/// A tree as read from a commit: the files, and the mode of each (so an executable stays one
/// when it is edited).
#[derive(Debug, Default)]
pub(crate) struct Tree {
    pub files: BTreeMap<VPath, FileData>,
    pub modes: HashMap<VPath, String>,
}

/// What a push did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// The branch now points at the commit.
    Accepted,
    /// The branch moved since it was read; nothing changed.
    Stale,
}

/// A change to commit: new bytes for a path, or its removal.
pub(crate) struct Change<'a> {
    pub path: &'a VPath,
    pub bytes: Option<&'a [u8]>,
}

/// One repository and the private mirror it is read through.
pub(crate) struct GitRepo {
    location: Location,
    branch: String,
    mirror: tempfile::TempDir,
}

/// The ref in the mirror that holds the branch as last read or pushed.
const HEAD_REF: &str = "refs/deepagents/head";
/// The ref history is read from, fetched apart so reading history never moves `HEAD_REF`.
const LATEST_REF: &str = "refs/deepagents/latest";

impl GitRepo {
    /// A repository at `location`, branch `branch`, with an empty mirror (nothing is fetched
    /// until [`fetch`](Self::fetch)).
    pub async fn open(location: Location, branch: String) -> Result<Self, GitError> {
        let mirror = tempfile::Builder::new()
            .prefix("deepagents-repo-")
            .tempdir()
            .map_err(GitError::Spawn)?;
        let repo = Self {
            location,
            branch,
            mirror,
        };
        repo.git(&["init", "--bare", "--quiet"], None, &[]).await?;
        Ok(repo)
    }

    /// Runs git on the mirror; fails unless it exits with 0.
    async fn git(
        &self,
        args: &[&str],
        stdin: Option<&[u8]>,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Result<Vec<u8>, GitError> {
        let output = self.run(args, stdin, env).await?;
        if output.status.success() {
            Ok(output.stdout)
        } else {
            Err(failed(args, &output))
        }
    }

    async fn run(
        &self,
        args: &[&str],
        stdin: Option<&[u8]>,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Result<std::process::Output, GitError> {
        let mut command = Command::new("git");
        command
            .args(args)
            .env("GIT_DIR", self.mirror.path())
            // Never wait for a password nobody will type; fail with git's message instead.
            .env("GIT_TERMINAL_PROMPT", "0")
            // Messages are matched below; keep them in English.
            .env("LC_ALL", "C")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().map_err(GitError::Spawn)?;
        // Feed stdin while the output is read, so a large answer cannot block a large question.
        let feeder = match (stdin, child.stdin.take()) {
            (Some(bytes), Some(mut pipe)) => {
                let bytes = bytes.to_vec();
                Some(tokio::spawn(async move {
                    // A broken pipe means git stopped reading; its exit status says why.
                    let _ = pipe.write_all(&bytes).await;
                }))
            }
            _ => None,
        };
        let output = child.wait_with_output().await.map_err(GitError::Spawn)?;
        if let Some(feeder) = feeder {
            let _ = feeder.await;
        }
        Ok(output)
    }

    /// Fetches the branch into the mirror and returns its commit; `None` when the repository
    /// or the branch does not exist yet.
    pub async fn fetch(&self) -> Result<Option<String>, GitError> {
        self.fetch_into(HEAD_REF).await
    }

    async fn fetch_into(&self, target: &str) -> Result<Option<String>, GitError> {
        if let Location::Local(path) = &self.location
            && !path.exists()
        {
            return Ok(None);
        }
        let refspec = format!("+refs/heads/{}:{target}", self.branch);
        let location = self.location.arg();
        let args = [
            "fetch",
            "--quiet",
            "--no-tags",
            "--no-write-fetch-head",
            "--",
            &location,
            &refspec,
        ];
        let output = self.run(&args, None, &[]).await?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            if stderr.contains("couldn't find remote ref") {
                // The branch is gone (or never was): forget what the mirror had of it.
                let _ = self.git(&["update-ref", "-d", target], None, &[]).await;
                return Ok(None);
            }
            return Err(failed(&args, &output));
        }
        self.resolve(target).await
    }

    async fn resolve(&self, reference: &str) -> Result<Option<String>, GitError> {
        let spec = format!("{reference}^{{commit}}");
        let output = self
            .run(&["rev-parse", "--verify", "--quiet", &spec], None, &[])
            .await?;
        if !output.status.success() {
            return Ok(None);
        }
        Ok(Some(
            String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        ))
    }

    /// Every file of `commit`. Symbolic links and submodules are left out: the tree the agent
    /// sees holds files only.
    pub async fn tree(&self, commit: &str) -> Result<Tree, GitError> {
        let listing = self
            .git(&["ls-tree", "-r", "-z", "--full-tree", commit], None, &[])
            .await?;
        let time_ms = self.commit_time(commit).await? * 1000;
        let mut entries = Vec::new();
        for record in listing.split(|b| *b == 0).filter(|r| !r.is_empty()) {
            let record = String::from_utf8_lossy(record);
            let unexpected = || GitError::Unexpected {
                command: "ls-tree".to_owned(),
                detail: record.to_string(),
            };
            let (meta, path) = record.split_once('\t').ok_or_else(unexpected)?;
            let mut fields = meta.split(' ');
            let (Some(mode), Some(kind), Some(oid)) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(unexpected());
            };
            if kind != "blob" || mode == "120000" {
                continue;
            }
            // A name git allows but a virtual path does not (e.g. with `\`) stays invisible.
            let Ok(path) = VPath::parse(&format!("/{path}")) else {
                continue;
            };
            entries.push((path, mode.to_owned(), oid.to_owned()));
        }
        let mut request = String::new();
        for (_, _, oid) in &entries {
            request.push_str(oid);
            request.push('\n');
        }
        let blobs = self
            .git(&["cat-file", "--batch"], Some(request.as_bytes()), &[])
            .await?;
        let mut tree = Tree::default();
        let mut rest = blobs.as_slice();
        for (path, mode, _) in entries {
            let (bytes, after) = next_blob(rest)?;
            rest = after;
            let mut file = file_data(&path, bytes.to_vec(), time_ms);
            file.created_at_ms = time_ms;
            tree.modes.insert(path.clone(), mode);
            tree.files.insert(path, file);
        }
        Ok(tree)
    }

    async fn commit_time(&self, commit: &str) -> Result<u64, GitError> {
        let out = self
            .git(&["show", "-s", "--format=%ct", commit], None, &[])
            .await?;
        Ok(String::from_utf8_lossy(&out).trim().parse().unwrap_or(0))
    }

    /// A commit of `changes` on top of `parent` (the empty tree when `None`); `None` when the
    /// changes leave the parent's tree as it was.
    pub async fn commit(
        &self,
        parent: Option<&str>,
        changes: &[Change<'_>],
        modes: &HashMap<VPath, String>,
        author: &Signature,
        message: &str,
    ) -> Result<Option<String>, GitError> {
        static NEXT_INDEX: AtomicU64 = AtomicU64::new(0);
        let index = self.mirror.path().join(format!(
            "deepagents-index-{}",
            NEXT_INDEX.fetch_add(1, Ordering::Relaxed)
        ));
        let result = self
            .commit_with_index(&index, parent, changes, modes, author, message)
            .await;
        let _ = tokio::fs::remove_file(&index).await;
        result
    }

    async fn commit_with_index(
        &self,
        index: &Path,
        parent: Option<&str>,
        changes: &[Change<'_>],
        modes: &HashMap<VPath, String>,
        author: &Signature,
        message: &str,
    ) -> Result<Option<String>, GitError> {
        let index_env = [("GIT_INDEX_FILE", index.as_os_str())];
        match parent {
            Some(parent) => self.git(&["read-tree", parent], None, &index_env).await?,
            None => {
                self.git(&["read-tree", "--empty"], None, &index_env)
                    .await?
            }
        };
        let mut info = Vec::new();
        for change in changes {
            let relative = change.path.as_str().trim_start_matches('/');
            match change.bytes {
                Some(bytes) => {
                    let oid = self
                        .git(&["hash-object", "-w", "--stdin"], Some(bytes), &[])
                        .await?;
                    let oid = String::from_utf8_lossy(&oid).trim().to_owned();
                    let mode = modes.get(change.path).map_or("100644", String::as_str);
                    info.extend_from_slice(format!("{mode} {oid}\t{relative}").as_bytes());
                }
                None => info.extend_from_slice(
                    format!("0 0000000000000000000000000000000000000000\t{relative}").as_bytes(),
                ),
            }
            info.push(0);
        }
        self.git(
            &["update-index", "-z", "--index-info"],
            Some(&info),
            &index_env,
        )
        .await?;
        let tree = self.git(&["write-tree"], None, &index_env).await?;
        let tree = String::from_utf8_lossy(&tree).trim().to_owned();
        if let Some(parent) = parent {
            let parent_tree = format!("{parent}^{{tree}}");
            let before = self.git(&["rev-parse", &parent_tree], None, &[]).await?;
            if String::from_utf8_lossy(&before).trim() == tree {
                return Ok(None);
            }
        }
        let mut args = vec!["commit-tree", tree.as_str()];
        if let Some(parent) = parent {
            args.extend(["-p", parent]);
        }
        // A signing setting of the user's would wait for a passphrase nobody types.
        args.extend(["--no-gpg-sign", "-F", "-"]);
        let name = std::ffi::OsStr::new(&author.name);
        let email = std::ffi::OsStr::new(&author.email);
        let identity = [
            ("GIT_AUTHOR_NAME", name),
            ("GIT_AUTHOR_EMAIL", email),
            ("GIT_COMMITTER_NAME", name),
            ("GIT_COMMITTER_EMAIL", email),
        ];
        let commit = self.git(&args, Some(message.as_bytes()), &identity).await?;
        Ok(Some(String::from_utf8_lossy(&commit).trim().to_owned()))
    }

    /// Pushes `commit` to the branch without force: the push is refused when the branch is no
    /// longer the commit's parent. A local repository that does not exist yet is created.
    pub async fn push(&self, commit: &str) -> Result<Pushed, GitError> {
        if let Location::Local(path) = &self.location
            && !path.exists()
        {
            self.create_local(path).await?;
        }
        let refspec = format!("{commit}:refs/heads/{}", self.branch);
        let location = self.location.arg();
        let args = ["push", "--porcelain", "--quiet", "--", &location, &refspec];
        let output = self.run(&args, None, &[]).await?;
        if output.status.success() {
            self.git(&["update-ref", HEAD_REF, commit], None, &[])
                .await?;
            return Ok(Pushed::Accepted);
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stale = stdout.lines().any(|line| {
            line.starts_with('!')
                && line.contains("[rejected]")
                && (line.contains("fetch first")
                    || line.contains("non-fast-forward")
                    || line.contains("stale info"))
        });
        if stale {
            return Ok(Pushed::Stale);
        }
        let mut error = failed(&args, &output);
        if let GitError::Failed { stderr, .. } = &mut error
            && stderr.contains("checked out")
        {
            stderr.push_str(
                "\n(the repository has this branch checked out in a work tree: use a bare \
                 repository, another branch, or run `git config receive.denyCurrentBranch \
                 updateInstead` in it)",
            );
        }
        Err(error)
    }

    async fn create_local(&self, path: &Path) -> Result<(), GitError> {
        tokio::fs::create_dir_all(path)
            .await
            .map_err(GitError::Spawn)?;
        let branch = format!("--initial-branch={}", self.branch);
        let output = Command::new("git")
            .args(["init", "--bare", "--quiet", &branch, "--"])
            .arg(path)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(GitError::Spawn)?;
        if output.status.success() {
            Ok(())
        } else {
            Err(failed(&["init", "--bare"], &output))
        }
    }

    /// The commits of the branch as it is now that touched `path` (the whole repository when
    /// `path` is the root), newest first.
    pub async fn history(&self, path: &VPath) -> Result<Vec<RepoCommit>, GitError> {
        if self.fetch_into(LATEST_REF).await?.is_none() {
            return Ok(Vec::new());
        }
        let relative = path.as_str().trim_start_matches('/');
        let mut args = vec![
            "log",
            "--format=%H%x1f%an%x1f%ae%x1f%at%x1f%s%x1e",
            LATEST_REF,
            "--",
        ];
        if !relative.is_empty() {
            args.push(relative);
        }
        let out = self.git(&args, None, &[]).await?;
        let text = String::from_utf8_lossy(&out);
        let mut commits = Vec::new();
        for record in text.split('\u{1e}') {
            let record = record.trim_start_matches('\n');
            if record.is_empty() {
                continue;
            }
            let fields: Vec<&str> = record.split('\u{1f}').collect();
            let [id, author, email, time, summary] = fields.as_slice() else {
                return Err(GitError::Unexpected {
                    command: "log".to_owned(),
                    detail: record.to_owned(),
                });
            };
            commits.push(RepoCommit {
                id: (*id).to_owned(),
                author: (*author).to_owned(),
                email: (*email).to_owned(),
                time: time.parse().unwrap_or(0),
                summary: (*summary).to_owned(),
            });
        }
        Ok(commits)
    }
}

/// The next object of `cat-file --batch` output: its bytes and what follows.
fn next_blob(output: &[u8]) -> Result<(&[u8], &[u8]), GitError> {
    let unexpected = |detail: &str| GitError::Unexpected {
        command: "cat-file".to_owned(),
        detail: detail.to_owned(),
    };
    let header_end = output
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| unexpected("a header without its end"))?;
    let header = String::from_utf8_lossy(&output[..header_end]);
    let size: usize = header
        .rsplit(' ')
        .next()
        .and_then(|size| size.parse().ok())
        .ok_or_else(|| unexpected(&header))?;
    let start = header_end + 1;
    let end = start
        .checked_add(size)
        .filter(|end| *end < output.len())
        .ok_or_else(|| unexpected("an object cut short"))?;
    // Each object is followed by a newline.
    Ok((&output[start..end], &output[end + 1..]))
}

fn failed(args: &[&str], output: &std::process::Output) -> GitError {
    GitError::Failed {
        command: args.first().copied().unwrap_or("").to_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    }
}
