//! Where the agent's files live for a CLI run: the backend and its permission rules.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use clap::ValueEnum;
use deepagents::Checkpointer;
use deepagents::backends::store::{SearchQuery, StoreError, StoreItem};
use deepagents::backends::{
    Backend, CompositeBackend, FilesystemBackend, LocalShellBackend, PermissionRule, Permissions,
    PolicyBackend, PostgresStore, ReadOnlyPolicy, RepoBackend, SqliteStore, StateBackend, Store,
    StoreBackend, VPath,
};
use serde::Deserialize;
use serde_json::Value;

/// The `--backend` choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// Files live in the run's state and vanish with it.
    State,
    /// Files are real files under --root; the agent cannot reach outside it.
    Filesystem,
    /// Like filesystem, plus `execute` runs shell commands in --root.
    Shell,
    /// Files are those of the git repository --repo; every change is a commit.
    Repo,
}

/// The repository backend for `source` (`--repo`), on `branch` when given, as the config's
/// `[repo]` section says.
pub fn repo_backend(
    source: &str,
    branch: Option<&str>,
    config: &crate::config::RepoConfig,
) -> anyhow::Result<RepoBackend> {
    let mut builder = RepoBackend::builder(source);
    if let Some(branch) = branch {
        builder = builder.branch(branch);
    }
    if let Some(base) = &config.base {
        builder = builder.base(base);
    }
    if config.author_name.is_some() || config.author_email.is_some() {
        builder = builder.author(
            config.author_name.as_deref().unwrap_or("deepagents"),
            config
                .author_email
                .as_deref()
                .unwrap_or("deepagents@localhost"),
        );
    }
    if let Some(message) = &config.message {
        builder = builder.message(message);
    }
    builder
        .build()
        .with_context(|| format!("cannot use `{source}` as a repository (--repo)"))
}

/// What a run works on: the backend, and the memory files and skill directories in it.
pub struct Workspace {
    /// Where files live.
    pub backend: Arc<dyn Backend>,
    /// Memory files, lowest precedence first.
    pub memory: Vec<String>,
    /// Skill directories, lowest precedence first.
    pub skills: Vec<String>,
    /// Where threads are checkpointed (the same database as long-term memory); only for a
    /// run on a thread.
    pub checkpointer: Option<Arc<dyn Checkpointer>>,
    /// The database of long-term memory and threads, to close before exiting.
    pub store: Arc<dyn Store>,
    /// The directory the disk backends work in; `None` for the state backend.
    pub root: Option<PathBuf>,
    /// The policy confined commands run under, which approvals widen for the session.
    pub sandbox: Option<deepagents::backends::sandbox::SharedPolicy>,
}

/// Where the user's own agent directory (`~/.deepagents/agent`) appears to the agent.
const USER_MOUNT: &str = "/.deepagents-user";
/// Where long-term memory (the store) appears to the agent.
const MEMORIES_MOUNT: &str = "/memories";

/// The database of long-term memory and threads: PostgreSQL when `DEEPAGENTS_DATABASE_URL`
/// is set (for servers and shared machines), else SQLite in the data directory.
pub async fn open_store() -> anyhow::Result<(Arc<dyn Store>, Arc<dyn Checkpointer>)> {
    if let Ok(url) = std::env::var("DEEPAGENTS_DATABASE_URL") {
        let store = PostgresStore::connect(&url)
            .await
            .context("cannot open the PostgreSQL database of DEEPAGENTS_DATABASE_URL")?;
        return Ok((Arc::new(store.clone()), Arc::new(store.checkpointer())));
    }
    let store = SqliteStore::open(data_dir()?.join("store.db"))
        .await
        .context("cannot open the data store (DEEPAGENTS_DATA_DIR chooses its directory)")?;
    Ok((Arc::new(store.clone()), Arc::new(store.checkpointer())))
}

/// The long-term memory store of a run that keeps no thread: SQLite in the data directory,
/// opened on first use, and not even then while the database does not exist and nothing is
/// written (reads of a missing database find nothing). A run that never touches `/memories/`
/// beyond reading its `AGENTS.md` so costs no database.
struct LazySqliteStore {
    path: PathBuf,
    opened: tokio::sync::OnceCell<SqliteStore>,
}

impl LazySqliteStore {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            opened: tokio::sync::OnceCell::new(),
        }
    }

    /// The store, opened (and created) now if it was not.
    async fn open(&self) -> Result<&SqliteStore, StoreError> {
        self.opened
            .get_or_try_init(|| SqliteStore::open(&self.path))
            .await
    }

    /// The store when there is something to read: `None` while no database exists.
    async fn existing(&self) -> Result<Option<&SqliteStore>, StoreError> {
        if self.opened.get().is_none() && !self.path.exists() {
            return Ok(None);
        }
        self.open().await.map(Some)
    }
}

#[async_trait::async_trait]
impl Store for LazySqliteStore {
    async fn get(&self, namespace: &[String], key: &str) -> Result<Option<StoreItem>, StoreError> {
        match self.existing().await? {
            Some(store) => store.get(namespace, key).await,
            None => Ok(None),
        }
    }

    async fn put(&self, namespace: &[String], key: &str, value: Value) -> Result<(), StoreError> {
        self.open().await?.put(namespace, key, value).await
    }

    async fn merge(
        &self,
        namespace: &[String],
        key: &str,
        patch: &Value,
    ) -> Result<Option<StoreItem>, StoreError> {
        match self.existing().await? {
            Some(store) => store.merge(namespace, key, patch).await,
            None => Ok(None),
        }
    }

    async fn delete(&self, namespace: &[String], key: &str) -> Result<bool, StoreError> {
        match self.existing().await? {
            Some(store) => store.delete(namespace, key).await,
            None => Ok(false),
        }
    }

    async fn search(
        &self,
        namespace_prefix: &[String],
        query: &SearchQuery,
    ) -> Result<Vec<StoreItem>, StoreError> {
        match self.existing().await? {
            Some(store) => store.search(namespace_prefix, query).await,
            None => Ok(Vec::new()),
        }
    }

    async fn close(&self) {
        if let Some(store) = self.opened.get() {
            store.close().await;
        }
    }
}

/// The CLI's data directory: `DEEPAGENTS_DATA_DIR`, else `$XDG_DATA_HOME/deepagents`, else
/// `~/.local/share/deepagents`; created when missing.
pub fn data_dir() -> anyhow::Result<PathBuf> {
    let dir = if let Some(dir) = std::env::var_os("DEEPAGENTS_DATA_DIR") {
        PathBuf::from(dir)
    } else if let Some(xdg) = std::env::var_os("XDG_DATA_HOME") {
        Path::new(&xdg).join("deepagents")
    } else if let Some(home) = std::env::var_os("HOME") {
        Path::new(&home).join(".local/share/deepagents")
    } else {
        anyhow::bail!("cannot find a data directory; set DEEPAGENTS_DATA_DIR");
    };
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    Ok(dir)
}

fn disk(root: &Path) -> anyhow::Result<FilesystemBackend> {
    disk_in_mode(root, true)
}

/// The disk under `root`; with `virtual_mode` off, paths are the host's own.
fn disk_in_mode(root: &Path, virtual_mode: bool) -> anyhow::Result<FilesystemBackend> {
    // A typo in a path should fail, not create a stray directory.
    FilesystemBackend::builder(root)
        .create_root(false)
        .virtual_mode(virtual_mode)
        .build()
        .with_context(|| format!("cannot use {} as a workspace directory", root.display()))
}

/// How the workspace's disk and shell behave (`virtual_mode`, `[shell]` and `[sandbox]` in the
/// config, `--sandbox`).
pub struct DiskOptions<'a> {
    /// Whether paths are confined to the root.
    pub virtual_mode: bool,
    /// The shell's timeout, output cap and environment.
    pub shell: &'a crate::config::ShellConfig,
    /// How commands are confined.
    pub sandbox: crate::sandbox::SandboxMode,
    /// What confines them (`--sandbox-engine`).
    pub sandbox_engine: Option<crate::sandbox::EngineSetting>,
    /// What the confinement allows.
    pub sandbox_config: &'a crate::sandbox::SandboxConfig,
    /// The permission rules of the file tools, which the confinement follows where it can.
    pub permissions: Option<&'a Permissions>,
    /// What the front end puts around the disk (an editor's buffers and terminal).
    pub layer: Option<&'a dyn DiskLayer>,
}

/// A front end's own layer around the workspace's disk backend: `deepagents acp` reads and
/// writes text files through the editor's buffers, and may run commands in its terminal.
/// The layer sits beneath the permission rules, the mounts and the harness's own routes, so
/// every path it gets has passed them; the checks of the disk itself (confinement to the
/// root, protected names) it makes through [`Disk::fs`].
pub trait DiskLayer: Send + Sync {
    /// The backend to use in place of `disk.backend`.
    fn wrap(&self, disk: Disk) -> Arc<dyn Backend>;
}

/// The workspace's disk, as a [`DiskLayer`] gets it.
pub struct Disk {
    /// The disk backend: the filesystem, or the shell over it.
    pub backend: Arc<dyn Backend>,
    /// The filesystem under it, with the shell's protected names: its checks and host paths.
    pub fs: FilesystemBackend,
    /// Whether commands run confined (`--sandbox` is not `off`); `false` without a shell.
    pub confined: bool,
    /// The default timeout of commands (`[shell] timeout`), when set.
    pub timeout: Option<std::time::Duration>,
    /// The output cap of commands (`[shell] max_output`), when set.
    pub max_output: Option<usize>,
    /// The variables every command gets (`[shell] env`).
    pub env: Vec<(String, String)>,
}

impl Disk {
    /// `backend` over `fs`, with the shell settings of `options`.
    fn new(
        backend: Arc<dyn Backend>,
        fs: FilesystemBackend,
        confined: bool,
        options: &crate::config::ShellConfig,
    ) -> Self {
        Self {
            backend,
            fs,
            confined,
            timeout: options.timeout.map(std::time::Duration::from_secs),
            max_output: options.max_output,
            env: options
                .env
                .iter()
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect(),
        }
    }
}

/// The shell over `fs` as `options` configure it.
fn shell(fs: FilesystemBackend, options: &crate::config::ShellConfig) -> LocalShellBackend {
    let mut shell = LocalShellBackend::new(fs).inherit_env(options.inherit_env);
    if let Some(seconds) = options.timeout {
        shell = shell.with_timeout(std::time::Duration::from_secs(seconds));
    }
    if let Some(bytes) = options.max_output {
        shell = shell.with_max_output_bytes(bytes);
    }
    for (name, value) in &options.env {
        shell = shell.with_env(name, value);
    }
    shell
}

/// Opens the workspace for `kind` rooted at `root` (default: the current directory); `repo`
/// is the repository of [`BackendKind::Repo`].
///
/// Memory comes from `~/.deepagents/agent/AGENTS.md`, then `.deepagents/AGENTS.md` and
/// `AGENTS.md` in the root, then `/memories/AGENTS.md` — long-term memory kept in a SQLite store
/// in the data directory and shared by every thread; skills from `~/.deepagents/agent/skills`, `.deepagents/skills`,
/// `.agents/skills`, then each `--skills DIR`. Directories outside the root are mounted into the
/// agent's tree (`/.deepagents-user/`, `/.skills-1/`, …) so the file tools can read them; they
/// are read-only, except that `edit_file` may change `/.deepagents-user/AGENTS.md`. Unless
/// `read_only_memory`, which also makes `/memories/` read-only. In a repository, memory is
/// its `AGENTS.md` and skills are under `/skills` (linked skill repositories included). With
/// `--backend shell` and a sandbox, the sandbox's protected names (`.git`, `.deepagents`,
/// `.agents`) are read-only for the file tools as for commands, except `.deepagents/AGENTS.md`
/// for the file tools unless `read_only_memory`.
pub async fn open(
    kind: BackendKind,
    repo: Option<RepoBackend>,
    root: Option<PathBuf>,
    skill_dirs: &[PathBuf],
    read_only_memory: bool,
    threaded: bool,
    disk_options: &DiskOptions<'_>,
) -> anyhow::Result<Workspace> {
    let mut workspace_root = None;
    let mut shared_policy = None;
    let base: Arc<dyn Backend> = match kind {
        BackendKind::State => Arc::new(StateBackend::default()),
        BackendKind::Repo => {
            Arc::new(repo.context("--backend repo needs the repository: --repo PATH_OR_URL")?)
        }
        BackendKind::Filesystem | BackendKind::Shell => {
            let root = match root {
                Some(root) => root,
                None => std::env::current_dir()
                    .context("cannot read the current directory; pass --root")?,
            };
            workspace_root = Some(root.clone());
            let fs = disk_in_mode(&root, disk_options.virtual_mode)?;
            if kind == BackendKind::Shell {
                let mut shell = shell(fs, disk_options.shell);
                let (policy, warnings) = crate::sandbox::policy(
                    &root,
                    disk_options.sandbox,
                    disk_options.sandbox_engine,
                    disk_options.sandbox_config,
                    disk_options.permissions,
                );
                eprintln!("{}", crate::sandbox::describe(policy.as_ref()));
                for warning in warnings {
                    eprintln!("{warning}");
                }
                if let Some(policy) = policy {
                    // The sandbox's protected names become read-only for the file tools too,
                    // except the project memory file the memory prompt asks the agent to keep
                    // up to date (as `~/.deepagents/agent/AGENTS.md` stays editable), unless
                    // memory is read-only. Commands still cannot change it.
                    shell = shell.with_sandbox(policy);
                    if !read_only_memory {
                        shell = shell.with_editable(".deepagents/AGENTS.md");
                    }
                    shared_policy = shell.sandbox().cloned();
                }
                let (fs, confined) = (shell.filesystem().clone(), shared_policy.is_some());
                let disk = Disk::new(Arc::new(shell), fs, confined, disk_options.shell);
                layered(disk, disk_options.layer)
            } else {
                let disk = Disk::new(Arc::new(fs.clone()), fs, false, disk_options.shell);
                layered(disk, disk_options.layer)
            }
        }
    };
    let mut memory = Vec::new();
    let mut skills = Vec::new();
    let mut routes: Vec<(String, Arc<dyn Backend>)> = Vec::new();
    let user_dir = std::env::var_os("HOME").map(|home| Path::new(&home).join(".deepagents/agent"));
    if let Some(user_dir) = user_dir.filter(|dir| dir.is_dir()) {
        let mut policy = ReadOnlyPolicy::new();
        if !read_only_memory {
            policy = policy.editable(VPath::parse("/AGENTS.md")?);
        }
        routes.push((USER_MOUNT.to_owned(), read_only(disk(&user_dir)?, policy)));
        memory.push(format!("{USER_MOUNT}/AGENTS.md"));
        skills.push(format!("{USER_MOUNT}/skills"));
    }
    if kind == BackendKind::Repo {
        memory.push("/AGENTS.md".to_owned());
        skills.push("/skills".to_owned());
    } else if kind != BackendKind::State {
        memory.push("/.deepagents/AGENTS.md".to_owned());
        memory.push("/AGENTS.md".to_owned());
        skills.push("/.deepagents/skills".to_owned());
        skills.push("/.agents/skills".to_owned());
    }
    // Long-term memory: one SQLite store in the user's data directory, shared by every thread.
    // A run without a thread opens it only when it is used.
    let (store, checkpointer) = if threaded || std::env::var_os("DEEPAGENTS_DATABASE_URL").is_some()
    {
        let (store, checkpointer) = open_store().await?;
        (store, Some(checkpointer))
    } else {
        let store: Arc<dyn Store> = Arc::new(LazySqliteStore::new(data_dir()?.join("store.db")));
        (store, None)
    };
    let memories = StoreBackend::new(store.clone())
        .with_namespace(|_| vec!["agents".to_owned(), "agent".to_owned()]);
    let memories: Arc<dyn Backend> = if read_only_memory {
        read_only(memories, ReadOnlyPolicy::new())
    } else {
        Arc::new(memories)
    };
    routes.push((MEMORIES_MOUNT.to_owned(), memories));
    memory.push(format!("{MEMORIES_MOUNT}/AGENTS.md"));
    for (index, dir) in skill_dirs.iter().enumerate() {
        let mount = format!("/.skills-{}", index + 1);
        routes.push((mount.clone(), read_only(disk(dir)?, ReadOnlyPolicy::new())));
        skills.push(mount);
    }
    let mut composite = CompositeBackend::new(base);
    for (mount, backend) in routes {
        composite = composite.route(&mount, backend)?;
    }
    Ok(Workspace {
        backend: Arc::new(composite),
        checkpointer,
        store,
        memory,
        skills,
        root: workspace_root,
        sandbox: shared_policy,
    })
}

/// The disk backend, inside the front end's layer when it has one.
fn layered(disk: Disk, layer: Option<&dyn DiskLayer>) -> Arc<dyn Backend> {
    match layer {
        Some(layer) => layer.wrap(disk),
        None => disk.backend,
    }
}

fn read_only(backend: impl Backend + 'static, policy: ReadOnlyPolicy) -> Arc<dyn Backend> {
    Arc::new(PolicyBackend::new(Arc::new(backend), Arc::new(policy)))
}

/// A `--permissions` file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PermissionsFile {
    #[serde(default)]
    rules: Vec<PermissionRule>,
}

/// Reads permission rules from a TOML file:
///
/// ```toml
/// [[rules]]
/// operations = ["read", "write"]
/// paths = ["/secrets/**"]
/// mode = "deny"
/// ```
pub fn permissions(path: &Path) -> anyhow::Result<Permissions> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the permissions file {}", path.display()))?;
    let file: PermissionsFile = toml::from_str(&text).with_context(|| {
        format!(
            "the permissions file {} is invalid (expected [[rules]] with operations, paths, mode)",
            path.display()
        )
    })?;
    Permissions::new(file.rules)
        .with_context(|| format!("the permissions file {} is invalid", path.display()))
}
