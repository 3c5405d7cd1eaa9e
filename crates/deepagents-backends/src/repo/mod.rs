//! A git repository as the agent's filesystem: every change is a commit.
//!
//! The agent repository is mounted at `/`; skill repositories it links to (in
//! [`LINKS_FILE`]) appear as `/skills/NAME/`. Each repository is fetched on first use into a
//! private mirror and its files kept in memory, so reads cost no git call. Each write, edit,
//! delete or upload becomes one commit on the last commit read, pushed without force: when
//! another writer moved the branch in between, the push is refused, nothing is saved, the
//! repository is fetched again and the call fails with [`BackendError::Conflict`], so the
//! model re-reads and retries against the new content.

mod git;
mod source;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use deepagents_core::{FileContent, FileData};
use serde::Deserialize;
use tokio::sync::{Mutex, MutexGuard, OnceCell};

pub use git::RepoCommit;
use git::{Change, GitError, GitRepo, Location, Pushed, Signature, Tree};

use crate::composite::CompositeBackend;
use crate::memory::{MemoryTree, file_data, now_ms};
use crate::path::VPath;
use crate::protocol::{
    Backend, BackendContext, BackendError, Changed, DEFAULT_MAX_FILE_SIZE, FileInfo, FileOpError,
    GlobResult, GrepQuery, GrepResult, RawFile, ReadResult,
};

/// The file of the agent repository that links skill repositories:
///
/// ```json
/// { "skills": { "review": "../review-skill.git", "lint": { "repo": "acme/lint", "branch": "v2" } } }
/// ```
///
/// Each name becomes `/skills/NAME/`. A source is resolved as the agent repository's is (see
/// [`RepoBackend::builder`]), except that relative ones are taken as git takes a submodule's:
/// `../review-skill.git` (or plain `review-skill.git`) is the agent repository's sibling.
/// Other keys are ignored. The file is read once, on first use.
pub const LINKS_FILE: &str = "/deepagents.json";

/// Where linked skill repositories are mounted.
const SKILLS_DIR: &str = "/skills";

/// A git repository as a backend: see the [module docs](self).
///
/// ```no_run
/// # async fn demo() -> Result<(), deepagents_backends::BackendError> {
/// use deepagents_backends::RepoBackend;
/// let backend = RepoBackend::builder("/srv/agents/reviewer.git")
///     .branch("main")
///     .author("Review bot", "bot@example.com")
///     .build()?;
/// # Ok(()) }
/// ```
///
/// Text files only are written: uploads that are not UTF-8 are refused per path as
/// `invalid_path`. Symbolic links and submodules in the repository are not shown. A local
/// repository that does not exist reads as empty and is created (bare) by the first write; a
/// remote one must exist, but may be empty.
pub struct RepoBackend {
    agent: Arc<RepoTree>,
    settings: Arc<Settings>,
    layout: OnceCell<Layout>,
}

/// How the backend commits.
struct Settings {
    base: Option<String>,
    author: Signature,
    message: String,
    max_file_size: u64,
}

impl Settings {
    /// The commit message for `operation` on `path` (and `more` other paths).
    fn message(&self, operation: &str, path: &VPath, more: usize) -> String {
        let mut target = path.to_string();
        if more > 0 {
            target.push_str(&format!(" and {more} more"));
        }
        self.message
            .replace("{operation}", operation)
            .replace("{path}", &target)
    }
}

/// The agent repository with its links, known after the first fetch.
struct Layout {
    backend: Arc<dyn Backend>,
    links: Vec<(VPath, Arc<RepoTree>)>,
}

/// Options of a [`RepoBackend`].
pub struct RepoBackendBuilder {
    source: String,
    branch: Option<String>,
    base: Option<String>,
    author: Signature,
    message: String,
    max_file_size: u64,
}

impl RepoBackendBuilder {
    /// The branch to read and commit to (default: the repository's default branch, `main` for
    /// a repository that has none yet).
    pub fn branch(mut self, branch: impl Into<String>) -> Self {
        self.branch = Some(branch.into());
        self
    }

    /// Where `owner/name` and `name` repositories are found: a URL prefix
    /// (`https://git.example.com`) or a local directory. Without a base they are paths.
    pub fn base(mut self, base: impl Into<String>) -> Self {
        self.base = Some(base.into());
        self
    }

    /// Author and committer of the commits (default `deepagents <deepagents@localhost>`).
    pub fn author(mut self, name: impl Into<String>, email: impl Into<String>) -> Self {
        self.author = Signature {
            name: name.into(),
            email: email.into(),
        };
        self
    }

    /// The commit message; `{operation}` (write, edit, delete, upload) and `{path}` are
    /// replaced. Default: `deepagents: {operation} {path}`.
    pub fn message(mut self, template: impl Into<String>) -> Self {
        self.message = template.into();
        self
    }

    /// The largest file written, edited or loaded whole, in bytes (default
    /// [`DEFAULT_MAX_FILE_SIZE`]).
    pub fn max_file_size(mut self, bytes: u64) -> Self {
        self.max_file_size = bytes;
        self
    }

    /// The backend. Nothing is fetched until its first call; this fails only on a source or
    /// branch git would misread.
    pub fn build(self) -> Result<RepoBackend, BackendError> {
        let location = source::resolve(&self.source, self.base.as_deref(), None)?;
        if let Some(branch) = &self.branch {
            source::check_branch(branch)?;
        }
        if self.author.name.trim().is_empty() || self.author.email.contains(['<', '>', '\n']) {
            return Err(invalid("author", "give a name and a plain email address"));
        }
        let settings = Arc::new(Settings {
            base: self.base,
            author: self.author,
            message: self.message,
            max_file_size: self.max_file_size,
        });
        Ok(RepoBackend {
            agent: Arc::new(RepoTree::new(location, self.branch, Arc::clone(&settings))),
            settings,
            layout: OnceCell::new(),
        })
    }
}

fn invalid(what: &'static str, message: impl Into<String>) -> BackendError {
    BackendError::InvalidQuery {
        what,
        message: message.into(),
    }
}

#[derive(Deserialize)]
struct LinksFile {
    #[serde(default)]
    skills: BTreeMap<String, LinkSpec>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum LinkSpec {
    Source(String),
    Full {
        repo: String,
        #[serde(default)]
        branch: Option<String>,
    },
}

impl RepoBackend {
    /// Options for the repository at `source`: `file://PATH` or a path starting with `/`,
    /// `./`, `../` or `~/`; a URL git can reach (`https://…`, `ssh://…`, `user@host:path`);
    /// or `owner/name` / `name`, joined to the [base](RepoBackendBuilder::base) when there is
    /// one and otherwise a path from the current directory.
    pub fn builder(source: impl Into<String>) -> RepoBackendBuilder {
        RepoBackendBuilder {
            source: source.into(),
            branch: None,
            base: None,
            author: Signature {
                name: "deepagents".to_owned(),
                email: "deepagents@localhost".to_owned(),
            },
            message: "deepagents: {operation} {path}".to_owned(),
            max_file_size: DEFAULT_MAX_FILE_SIZE,
        }
    }

    /// The repository at `source` with the default options.
    pub fn new(source: impl Into<String>) -> Result<Self, BackendError> {
        Self::builder(source).build()
    }

    /// The commits that changed `path` (a file or a directory; `/` for all), newest first, as
    /// the repository has them now. A path under `/skills/NAME/` asks the linked repository.
    pub async fn history(&self, path: &VPath) -> Result<Vec<RepoCommit>, BackendError> {
        let layout = self.layout().await?;
        for (prefix, tree) in &layout.links {
            if let Some(inner) = path.strip_prefix(prefix) {
                return tree.history(&inner).await;
            }
        }
        self.agent.history(path).await
    }

    async fn layout(&self) -> Result<&Layout, BackendError> {
        self.layout.get_or_try_init(|| self.read_layout()).await
    }

    async fn read_layout(&self) -> Result<Layout, BackendError> {
        let links_path = VPath::parse(LINKS_FILE)?;
        let text = {
            let loaded = self.agent.loaded().await?;
            match loaded.files.file(&links_path).map(|file| &file.content) {
                Some(FileContent::Text { text }) => Some(text.clone()),
                Some(FileContent::Binary { .. }) => {
                    return Err(self.bad_links("it is not UTF-8 text"));
                }
                None => None,
            }
        };
        let agent: Arc<dyn Backend> = self.agent.clone();
        let Some(text) = text else {
            return Ok(Layout {
                backend: agent,
                links: Vec::new(),
            });
        };
        let file: LinksFile =
            serde_json::from_str(&text).map_err(|e| self.bad_links(&e.to_string()))?;
        let mut composite = CompositeBackend::new(agent);
        let mut links = Vec::new();
        for (name, spec) in file.skills {
            let (repo, branch) = match spec {
                LinkSpec::Source(repo) => (repo, None),
                LinkSpec::Full { repo, branch } => (repo, branch),
            };
            let prefix = VPath::parse(SKILLS_DIR)?
                .join(&name)
                .ok()
                .filter(|p| {
                    p.parent()
                        .is_some_and(|parent| parent.as_str() == SKILLS_DIR)
                })
                .ok_or_else(|| {
                    self.bad_links(&format!("the skill name `{name}` is not one path segment"))
                })?;
            let location = source::resolve(
                &repo,
                self.settings.base.as_deref(),
                Some(self.agent.location()),
            )
            .map_err(|e| self.bad_links(&format!("skill `{name}`: {e}")))?;
            if let Some(branch) = &branch {
                source::check_branch(branch)
                    .map_err(|e| self.bad_links(&format!("skill `{name}`: {e}")))?;
            }
            let tree = Arc::new(RepoTree::new(location, branch, Arc::clone(&self.settings)));
            composite = composite.route(prefix.as_str(), tree.clone())?;
            links.push((prefix, tree));
        }
        Ok(Layout {
            backend: Arc::new(composite),
            links,
        })
    }

    fn bad_links(&self, why: &str) -> BackendError {
        BackendError::Io {
            operation: "read the repository links",
            path: LINKS_FILE.to_owned(),
            message: format!(
                "{LINKS_FILE} in {} is invalid ({why}); fix it in the repository. Expected \
                 {{\"skills\": {{\"NAME\": \"REPOSITORY\"}}}}",
                self.agent.location()
            ),
        }
    }

    async fn routed(&self) -> Result<Arc<dyn Backend>, BackendError> {
        Ok(Arc::clone(&self.layout().await?.backend))
    }
}

crate::delegate::delegate_backend! {
    impl Backend for RepoBackend {
        forward [ls, read, read_raw, write, overwrite, edit, delete, glob, grep]
            to |self, cx| self.routed().await?;

        fn name(&self) -> &'static str {
            "repo"
        }

        async fn upload_files(
            &self,
            cx: &BackendContext,
            files: Vec<(String, Vec<u8>)>,
        ) -> Changed<Vec<Result<(), FileOpError>>> {
            match self.routed().await {
                Ok(backend) => backend.upload_files(cx, files).await,
                Err(_) => Changed::outside_state(
                    files.iter().map(|_| Err(FileOpError::PermissionDenied)).collect(),
                ),
            }
        }

        async fn download_files(
            &self,
            cx: &BackendContext,
            paths: Vec<String>,
        ) -> Vec<Result<Vec<u8>, FileOpError>> {
            match self.routed().await {
                Ok(backend) => backend.download_files(cx, paths).await,
                Err(_) => paths.iter().map(|_| Err(FileOpError::PermissionDenied)).collect(),
            }
        }
    }
}

/// One repository: its files as of the last commit read, and how to commit to it.
struct RepoTree {
    location: Location,
    branch: Option<String>,
    settings: Arc<Settings>,
    /// Filled by the first call's fetch. The lock is held across a commit and its push, so
    /// the calls of one process commit one after another, each on the last.
    state: OnceCell<Mutex<Loaded>>,
}

struct Loaded {
    repo: GitRepo,
    head: Option<String>,
    /// The files of `head`, as the read-side operations want them.
    files: MemoryTree<FileData>,
    /// The mode of each file (so an executable stays one when it is edited).
    modes: HashMap<VPath, String>,
}

/// A change to make, owned until it is committed.
struct Pending {
    path: VPath,
    bytes: Option<Vec<u8>>,
}

impl RepoTree {
    fn new(location: Location, branch: Option<String>, settings: Arc<Settings>) -> Self {
        Self {
            location,
            branch,
            settings,
            state: OnceCell::new(),
        }
    }

    fn location(&self) -> &Location {
        &self.location
    }

    fn git_error(&self, operation: &'static str, path: &VPath, error: GitError) -> BackendError {
        BackendError::Io {
            operation,
            path: path.to_string(),
            message: format!("{error} (repository {})", self.location),
        }
    }

    /// The state, fetched on first use.
    async fn loaded(&self) -> Result<MutexGuard<'_, Loaded>, BackendError> {
        let state = self.state.get_or_try_init(|| self.first_fetch()).await?;
        Ok(state.lock().await)
    }

    async fn first_fetch(&self) -> Result<Mutex<Loaded>, BackendError> {
        let root = VPath::root();
        let branch = match &self.branch {
            Some(branch) => branch.clone(),
            None => source::default_branch(&self.location)
                .await
                .map_err(|e| self.git_error("fetch", &root, e))?,
        };
        let repo = GitRepo::open(self.location.clone(), branch)
            .await
            .map_err(|e| self.git_error("fetch", &root, e))?;
        let mut loaded = Loaded {
            repo,
            head: None,
            files: MemoryTree::new(BTreeMap::new()),
            modes: HashMap::new(),
        };
        self.refetch(&mut loaded)
            .await
            .map_err(|e| self.git_error("fetch", &root, e))?;
        Ok(Mutex::new(loaded))
    }

    /// Reads the branch as it is now into `loaded`.
    async fn refetch(&self, loaded: &mut Loaded) -> Result<(), GitError> {
        let (head, tree) = match loaded.repo.fetch().await? {
            Some(head) => {
                let tree = loaded.repo.tree(&head).await?;
                (Some(head), tree)
            }
            None => (None, Tree::default()),
        };
        loaded.head = head;
        loaded.files = MemoryTree::new(tree.files).with_max_file_size(self.settings.max_file_size);
        loaded.modes = tree.modes;
        Ok(())
    }

    /// Runs a read-side operation on the current files.
    async fn read_with<T>(
        &self,
        op: impl FnOnce(&MemoryTree<FileData>) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        op(&self.loaded().await?.files)
    }

    /// Commits `changes` as one commit and pushes it. On success the cache shows them; when
    /// another writer got there first, nothing is saved, the cache is fetched again, and the
    /// answer is [`BackendError::Conflict`] naming `path`.
    async fn commit(
        &self,
        loaded: &mut Loaded,
        operation: &'static str,
        path: &VPath,
        changes: Vec<Pending>,
    ) -> Result<(), BackendError> {
        let Some(first) = changes.first() else {
            return Ok(());
        };
        let message = self
            .settings
            .message(operation, &first.path, changes.len() - 1);
        let borrowed: Vec<Change<'_>> = changes
            .iter()
            .map(|c| Change {
                path: &c.path,
                bytes: c.bytes.as_deref(),
            })
            .collect();
        let commit = loaded
            .repo
            .commit(
                loaded.head.as_deref(),
                &borrowed,
                &loaded.modes,
                &self.settings.author,
                &message,
            )
            .await
            .map_err(|e| self.git_error(operation, path, e))?;
        let Some(commit) = commit else {
            // Nothing changed (e.g. an edit to the same text): no commit to make.
            return Ok(());
        };
        let pushed = loaded
            .repo
            .push(&commit)
            .await
            .map_err(|e| self.git_error(operation, path, e))?;
        if pushed == Pushed::Stale {
            self.refetch(loaded)
                .await
                .map_err(|e| self.git_error(operation, path, e))?;
            return Err(BackendError::Conflict {
                path: path.to_string(),
            });
        }
        loaded.head = Some(commit);
        let now = now_ms();
        for change in changes {
            match change.bytes {
                Some(bytes) => {
                    let previous = loaded.files.file(&change.path);
                    let file = file_data(&change.path, bytes, now).replacing(previous);
                    loaded.files.insert(change.path, file);
                }
                None => {
                    loaded.files.remove(&change.path);
                    loaded.modes.remove(&change.path);
                }
            }
        }
        Ok(())
    }

    /// Writes `content` at `path`, refusing an existing file unless `replace`.
    async fn put(&self, path: &VPath, content: &str, replace: bool) -> Result<(), BackendError> {
        let mut loaded = self.loaded().await?;
        loaded.files.check_write(path, content.len())?;
        if !replace && loaded.files.file(path).is_some() {
            return Err(BackendError::AlreadyExists {
                path: path.to_string(),
            });
        }
        let change = Pending {
            path: path.clone(),
            bytes: Some(content.as_bytes().to_vec()),
        };
        self.commit(&mut loaded, "write", path, vec![change]).await
    }

    async fn history(&self, path: &VPath) -> Result<Vec<RepoCommit>, BackendError> {
        self.loaded()
            .await?
            .repo
            .history(path)
            .await
            .map_err(|e| self.git_error("history", path, e))
    }
}

#[async_trait]
impl Backend for RepoTree {
    fn name(&self) -> &'static str {
        "repo"
    }

    async fn ls(&self, _cx: &BackendContext, path: &VPath) -> Result<Vec<FileInfo>, BackendError> {
        self.read_with(|tree| match tree.ls(path) {
            // An empty repository is an empty directory, not a missing one.
            Err(BackendError::NotFound { .. }) if path.is_root() => Ok(Vec::new()),
            other => other,
        })
        .await
    }

    async fn read(
        &self,
        _cx: &BackendContext,
        path: &VPath,
        offset: usize,
        limit: usize,
    ) -> Result<ReadResult, BackendError> {
        self.read_with(|tree| tree.read(path, offset, limit)).await
    }

    async fn read_raw(&self, _cx: &BackendContext, path: &VPath) -> Result<RawFile, BackendError> {
        self.read_with(|tree| tree.read_raw(path)).await
    }

    async fn write(
        &self,
        _cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        self.put(path, content, false).await?;
        Ok(Changed::outside_state(()))
    }

    async fn overwrite(
        &self,
        _cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        self.put(path, content, true).await?;
        Ok(Changed::outside_state(()))
    }

    async fn edit(
        &self,
        _cx: &BackendContext,
        path: &VPath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<Changed<usize>, BackendError> {
        let mut loaded = self.loaded().await?;
        let (content, count) = loaded.files.edit_content(path, old, new, replace_all)?;
        let bytes = match content {
            FileContent::Text { text } => text.into_bytes(),
            FileContent::Binary { data, .. } => data,
        };
        let change = Pending {
            path: path.clone(),
            bytes: Some(bytes),
        };
        self.commit(&mut loaded, "edit", path, vec![change]).await?;
        Ok(Changed::outside_state(count))
    }

    async fn delete(
        &self,
        _cx: &BackendContext,
        path: &VPath,
    ) -> Result<Changed<usize>, BackendError> {
        let mut loaded = self.loaded().await?;
        let doomed = loaded.files.delete_set(path)?;
        let count = doomed.len();
        let changes = doomed
            .into_iter()
            .map(|path| Pending { path, bytes: None })
            .collect();
        self.commit(&mut loaded, "delete", path, changes).await?;
        Ok(Changed::outside_state(count))
    }

    async fn glob(
        &self,
        _cx: &BackendContext,
        pattern: &str,
        base: &VPath,
    ) -> Result<GlobResult, BackendError> {
        self.read_with(|tree| tree.glob(pattern, base)).await
    }

    async fn grep(
        &self,
        _cx: &BackendContext,
        query: &GrepQuery,
    ) -> Result<GrepResult, BackendError> {
        self.read_with(|tree| tree.grep(query)).await
    }

    /// All files of one call in one commit. Bytes that are not UTF-8 are refused as
    /// `invalid_path`, as the reference system's repository backend does; when the commit
    /// cannot be saved every file of it answers `permission_denied`.
    async fn upload_files(
        &self,
        _cx: &BackendContext,
        files: Vec<(String, Vec<u8>)>,
    ) -> Changed<Vec<Result<(), FileOpError>>> {
        let Ok(mut loaded) = self.loaded().await else {
            return Changed::outside_state(
                files
                    .iter()
                    .map(|_| Err(FileOpError::PermissionDenied))
                    .collect(),
            );
        };
        let mut answers: Vec<Result<(), FileOpError>> = Vec::with_capacity(files.len());
        let mut changes: Vec<Pending> = Vec::new();
        {
            let view = &loaded.files;
            for (raw, bytes) in files {
                let checked = VPath::parse(&raw)
                    .map_err(|_| FileOpError::InvalidPath)
                    .and_then(|path| {
                        if std::str::from_utf8(&bytes).is_err() {
                            return Err(FileOpError::InvalidPath);
                        }
                        view.check_write(&path, bytes.len())
                            .map_err(|e| e.file_op_code())?;
                        Ok(path)
                    });
                answers.push(checked.map(|path| {
                    // A path uploaded twice in one call keeps its last bytes.
                    changes.retain(|c| c.path != path);
                    changes.push(Pending {
                        path,
                        bytes: Some(bytes),
                    });
                }));
            }
        }
        if let Some(first) = changes.first().map(|c| c.path.clone())
            && self
                .commit(&mut loaded, "upload", &first, changes)
                .await
                .is_err()
        {
            for answer in answers.iter_mut().filter(|a| a.is_ok()) {
                *answer = Err(FileOpError::PermissionDenied);
            }
        }
        Changed::outside_state(answers)
    }

    async fn download_files(
        &self,
        _cx: &BackendContext,
        paths: Vec<String>,
    ) -> Vec<Result<Vec<u8>, FileOpError>> {
        match self
            .read_with(|tree| Ok(tree.download_files(paths.clone())))
            .await
        {
            Ok(answers) => answers,
            Err(_) => paths
                .iter()
                .map(|_| Err(FileOpError::PermissionDenied))
                .collect(),
        }
    }
}
