//! The agent `create_deep_agent` describes: its JSON configuration, and the Python objects
//! (tool adapters, backend adapters) it names by index, built into an [`Agent`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use deepagents::backends::sandbox::Policy;
use deepagents::backends::{
    Backend, BackendContext, CompositeBackend, FilesystemBackend, InMemoryStore, LocalShellBackend,
    PermissionRule, Permissions, PostgresStore, SqliteStore, StateBackend, Store, StoreBackend,
};
use deepagents::core::{Checkpointer, InMemoryCheckpointer, Model, SpendLimits, ToolSpec};
use deepagents::middleware::RemoteSubAgent;
use deepagents::models::ScriptedModel;
use deepagents::{Agent, AgentBuilder, DecisionKind, InterruptConfig, SubAgent};
use deepagents_langgraph::StepWatch;
use pyo3::prelude::*;
use serde::Deserialize;
use serde_json::Value;

use crate::backend::PyBackend;
use crate::middleware::{MiddlewareConfig, PyMiddleware};
use crate::model::{ModelObject, PyModel, from_object};
use crate::tool::{PyTool, RunData};

/// Everything `create_deep_agent` was given, as the Python side encodes it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    model: ModelConfig,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    system_prompt: Option<String>,
    #[serde(default)]
    tools: Vec<ToolConfig>,
    #[serde(default)]
    subagents: Vec<SubAgentConfig>,
    /// The reference's `AsyncSubAgent` specs (`graph_id` on an Agent Protocol server).
    #[serde(default)]
    remote_subagents: Vec<RemoteSubAgentConfig>,
    #[serde(default)]
    general_purpose_subagent: Option<bool>,
    #[serde(default)]
    skills: Vec<String>,
    #[serde(default)]
    memory: Vec<String>,
    #[serde(default)]
    backend: Option<BackendConfig>,
    #[serde(default)]
    interrupt_on: BTreeMap<String, InterruptSpec>,
    #[serde(default)]
    permissions: Vec<PermissionRule>,
    #[serde(default)]
    response_format: Option<Value>,
    /// Index of a [`NativeStorage`] in the objects list.
    #[serde(default)]
    checkpointer: Option<usize>,
    /// Index of a [`NativeStorage`] in the objects list.
    #[serde(default)]
    store: Option<usize>,
    #[serde(default)]
    todos: Option<bool>,
    /// Whether the `ask_user` tool is offered (off unless asked for: the reference has none).
    #[serde(default)]
    ask_user: bool,
    #[serde(default)]
    max_turns: Option<u32>,
    #[serde(default)]
    spend_limits: Option<SpendLimits>,
    /// The user's Python middleware, in order, after the built-in ones.
    #[serde(default)]
    middleware: Vec<MiddlewareConfig>,
}

/// A `provider:model` spec (the CLI's, `scripted:PATH` included), a script inline, or a spec
/// with the settings of a LangChain chat model object.
#[derive(Deserialize)]
#[serde(untagged)]
enum ModelConfig {
    Spec(String),
    Script {
        script: Value,
    },
    /// A chat model object called through its adapter: index in the objects list, and the
    /// name it goes by.
    Python {
        python: usize,
        id: String,
    },
    Object(ModelObject),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolConfig {
    name: String,
    description: String,
    parameters: Value,
    /// Index of the adapter in the objects list.
    object: usize,
    #[serde(default)]
    mutating: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubAgentConfig {
    name: String,
    description: String,
    #[serde(default)]
    system_prompt: String,
    /// `None`: the parent's tools.
    #[serde(default)]
    tools: Option<Vec<ToolConfig>>,
    #[serde(default)]
    model: Option<ModelConfig>,
    #[serde(default)]
    interrupt_on: Option<BTreeMap<String, InterruptSpec>>,
    #[serde(default)]
    skills: Vec<String>,
    #[serde(default)]
    permissions: Option<Vec<PermissionRule>>,
    #[serde(default)]
    response_format: Option<Value>,
    /// `isolated` (the default) or `fork`.
    #[serde(default)]
    mode: Option<String>,
    /// `"async": True`: started in the background with `start_async_task`.
    #[serde(default)]
    asynchronous: bool,
}

/// An async subagent on an Agent Protocol server, as the reference's `AsyncSubAgent` names it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoteSubAgentConfig {
    name: String,
    description: String,
    url: String,
    graph_id: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// `true`, `false`, or `{"allowed_decisions": […], "description": …}`.
#[derive(Deserialize)]
#[serde(untagged)]
enum InterruptSpec {
    Flag(bool),
    Config {
        #[serde(default)]
        allowed_decisions: Option<Vec<DecisionKind>>,
        #[serde(default)]
        description: Option<String>,
    },
}

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum BackendConfig {
    State,
    Filesystem {
        root_dir: Option<PathBuf>,
        #[serde(default = "yes")]
        virtual_mode: bool,
    },
    LocalShell {
        root_dir: Option<PathBuf>,
        #[serde(default = "yes")]
        virtual_mode: bool,
        #[serde(default)]
        timeout: Option<f64>,
        #[serde(default)]
        max_output_bytes: Option<usize>,
        #[serde(default)]
        env: BTreeMap<String, String>,
        #[serde(default)]
        inherit_env: bool,
        #[serde(default)]
        sandbox: bool,
    },
    Store {
        #[serde(default)]
        namespace: Option<Vec<String>>,
        /// Index of the [`NativeStorage`] given as `StoreBackend(store=…)`; the agent's
        /// store otherwise.
        #[serde(default)]
        store: Option<usize>,
        /// Index of the adapter of `namespace=` given as a function of the runtime: called
        /// with the run's context object, thread id and assistant id, it answers the
        /// namespace.
        #[serde(default)]
        namespace_fn: Option<usize>,
    },
    Composite {
        default: Box<BackendConfig>,
        routes: BTreeMap<String, BackendConfig>,
    },
    Python {
        object: usize,
        #[serde(default)]
        execute: bool,
    },
}

fn yes() -> bool {
    true
}

/// Where threads or long-term memory are kept, as `InMemorySaver()`, `SqliteSaver(path)`,
/// `PostgresSaver(url)` (and the stores) describe it.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum StorageConfig {
    Memory,
    Sqlite { path: PathBuf },
    Postgres { url: String },
}

/// A built agent and what its runs need besides it.
pub struct Built {
    pub agent: Agent,
    /// Every run's steps pass through it (the `values` and `updates` modes).
    pub watch: Arc<StepWatch>,
    /// Whether the caller gave a checkpointer: without one, threads are not kept.
    pub persistent: bool,
    /// The custom state keys the Python middleware declared: shown with the thread's values.
    pub state_keys: Arc<[String]>,
}

impl Built {
    /// `run`'s state as the values `invoke` and `get_state` answer: messages, todos, files,
    /// the structured response, pending interrupts, and the middleware's state keys.
    pub fn values(&self, run: &deepagents::core::Run) -> Value {
        let mut values = deepagents_langgraph::convert::values(
            run,
            &deepagents_langgraph::convert::interrupt_id(run),
        );
        if let Value::Object(map) = &mut values {
            for key in self.state_keys.iter() {
                if let Some(value) = run.state.custom.get(key) {
                    map.insert(key.clone(), value.clone());
                }
            }
        }
        values
    }
}

/// Builds the agent. Errors say which argument is wrong.
pub async fn build(config: AgentConfig, objects: Vec<Arc<Py<PyAny>>>) -> Result<Built, String> {
    let model = model(&config.model, &objects)?;
    let mut builder = Agent::builder(model);
    if let Some(name) = &config.name {
        builder = builder.name(name.clone());
    }
    if let Some(prompt) = &config.system_prompt {
        builder = builder.system_prompt(prompt.clone());
    }
    for tool in &config.tools {
        builder = builder.dyn_tool(py_tool(tool, &objects)?);
    }
    let store = match config.store {
        Some(index) => Some(storage(&objects, index, |s| s.store.clone())?),
        None => None,
    };
    if let Some(store) = &store {
        builder = builder.store(Arc::clone(store));
    }
    if let Some(backend) = &config.backend {
        builder = builder.backend(backend_of(backend, &objects, store.as_ref())?);
    }
    for (tool, spec) in &config.interrupt_on {
        if let Some(interrupt) = interrupt(spec) {
            builder = builder.interrupt_on(tool.clone(), interrupt);
        }
    }
    if !config.permissions.is_empty() {
        builder = builder.permissions(permissions(&config.permissions)?);
    }
    if let Some(schema) = &config.response_format {
        builder = builder.response_format(schema.clone());
    }
    if !config.skills.is_empty() {
        builder = builder.skills(config.skills.clone());
    }
    if !config.memory.is_empty() {
        builder = builder.memory(config.memory.clone());
    }
    if let Some(todos) = config.todos {
        builder = builder.todos(todos);
    }
    if config.ask_user {
        builder = builder.ask_user(true);
    }
    if let Some(turns) = config.max_turns {
        builder = builder.max_turns(turns);
    }
    if let Some(limits) = config.spend_limits {
        builder = builder.spend_limits(limits);
    }
    if let Some(general) = config.general_purpose_subagent {
        builder = builder.general_purpose_subagent(general);
    }
    for sub in &config.subagents {
        builder = builder.subagent(subagent(sub, &objects)?);
    }
    for remote in &config.remote_subagents {
        builder = builder.remote_subagent(RemoteSubAgent {
            name: remote.name.clone(),
            description: remote.description.clone(),
            url: remote.url.clone(),
            graph_id: remote.graph_id.clone(),
            headers: remote
                .headers
                .iter()
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect(),
        });
    }
    let visible_keys: Arc<[String]> = config
        .middleware
        .iter()
        .flat_map(|m| m.state_keys.iter().cloned())
        .collect();
    for middleware in &config.middleware {
        builder = builder.middleware(PyMiddleware::new(
            middleware,
            &objects,
            Arc::clone(&visible_keys),
        )?);
    }
    let persistent = config.checkpointer.is_some();
    let inner: Arc<dyn Checkpointer> = match config.checkpointer {
        Some(index) => storage(&objects, index, |s| s.checkpointer.clone())?,
        None => Arc::new(InMemoryCheckpointer::default()),
    };
    let watch = StepWatch::new(inner);
    builder = builder.checkpointer(Arc::clone(&watch) as Arc<dyn Checkpointer>);
    let agent = build_agent(builder)?;
    Ok(Built {
        agent,
        watch,
        persistent,
        state_keys: visible_keys,
    })
}

fn build_agent(builder: AgentBuilder) -> Result<Agent, String> {
    builder.build().map_err(|e| match e {
        // Said in this package's terms: it takes no prices of its own.
        deepagents::BuildError::UnpricedCostCap { model } => format!(
            "max_cost_usd needs the model's prices, and none are known for `{model}`: cap its tokens instead (max_tokens=…)"
        ),
        e => format!("cannot build the agent: {e}"),
    })
}

fn model(config: &ModelConfig, objects: &[Arc<Py<PyAny>>]) -> Result<Arc<dyn Model>, String> {
    match config {
        ModelConfig::Python { python, id } => {
            let adapter = objects
                .get(*python)
                .ok_or_else(|| format!("model {id:?} refers to no object"))?;
            Ok(Arc::new(PyModel::new(id.clone(), Arc::clone(adapter))))
        }
        ModelConfig::Spec(spec) => {
            deepagents::models::from_spec(spec).map_err(|e| format!("model {spec:?}: {e}"))
        }
        ModelConfig::Script { script } => ScriptedModel::from_json(&script.to_string())
            .map(|model| Arc::new(model) as Arc<dyn Model>)
            .map_err(|e| format!("ScriptedModel: {e}")),
        ModelConfig::Object(object) => from_object(object),
    }
}

fn py_tool(tool: &ToolConfig, objects: &[Arc<Py<PyAny>>]) -> Result<Arc<PyTool>, String> {
    let function = objects
        .get(tool.object)
        .ok_or_else(|| format!("tool `{}` refers to no function", tool.name))?;
    Ok(Arc::new(PyTool {
        spec: ToolSpec {
            name: tool.name.clone(),
            description: tool.description.clone(),
            parameters: Arc::new(tool.parameters.clone()),
        },
        function: Arc::clone(function),
        mutating: tool.mutating,
    }))
}

fn interrupt(spec: &InterruptSpec) -> Option<InterruptConfig> {
    match spec {
        InterruptSpec::Flag(false) => None,
        InterruptSpec::Flag(true) => Some(InterruptConfig::default()),
        InterruptSpec::Config {
            allowed_decisions,
            description,
        } => {
            let mut config = InterruptConfig::default();
            if let Some(allowed) = allowed_decisions {
                config.allowed = allowed.clone();
            }
            config.description = description.clone();
            Some(config)
        }
    }
}

fn permissions(rules: &[PermissionRule]) -> Result<Permissions, String> {
    Permissions::new(rules.to_vec()).map_err(|e| format!("permissions: {e}"))
}

fn subagent(config: &SubAgentConfig, objects: &[Arc<Py<PyAny>>]) -> Result<SubAgent, String> {
    let mut sub = SubAgent::new(
        config.name.clone(),
        config.description.clone(),
        config.system_prompt.clone(),
    );
    if let Some(model_config) = &config.model {
        sub = sub.model(model(model_config, objects)?);
    }
    for tool in config.tools.iter().flatten() {
        sub = sub.dyn_tool(py_tool(tool, objects)?);
    }
    if let Some(interrupts) = &config.interrupt_on {
        sub = sub.no_interrupts();
        for (tool, spec) in interrupts {
            if let Some(interrupt) = interrupt(spec) {
                sub = sub.interrupt_on(tool.clone(), interrupt);
            }
        }
    }
    if !config.skills.is_empty() {
        sub = sub.skills(config.skills.clone());
    }
    if let Some(rules) = &config.permissions {
        sub = sub.permissions(permissions(rules)?);
    }
    if let Some(schema) = &config.response_format {
        sub = sub.response_format(schema.clone());
    }
    if let Some(mode) = &config.mode {
        let mode = mode
            .parse::<deepagents::SubAgentMode>()
            .map_err(|e| format!("subagent `{}`: {e}", config.name))?;
        sub = sub.mode(mode);
    }
    if config.asynchronous {
        sub = sub.asynchronous(true);
    }
    Ok(sub)
}

fn root(dir: &Option<PathBuf>) -> Result<PathBuf, String> {
    match dir {
        Some(dir) => Ok(dir.clone()),
        None => std::env::current_dir()
            .map_err(|e| format!("no root_dir and no working directory: {e}")),
    }
}

fn backend_of(
    config: &BackendConfig,
    objects: &[Arc<Py<PyAny>>],
    store: Option<&Arc<dyn Store>>,
) -> Result<Arc<dyn Backend>, String> {
    Ok(match config {
        BackendConfig::State => Arc::new(StateBackend::default()),
        BackendConfig::Filesystem {
            root_dir,
            virtual_mode,
        } => Arc::new(filesystem(root_dir, *virtual_mode)?),
        BackendConfig::LocalShell {
            root_dir,
            virtual_mode,
            timeout,
            max_output_bytes,
            env,
            inherit_env,
            sandbox,
        } => {
            let fs = filesystem(root_dir, *virtual_mode)?;
            let root = fs.root().to_path_buf();
            let mut shell = LocalShellBackend::new(fs);
            if let Some(seconds) = timeout {
                shell = shell.with_timeout(Duration::from_secs_f64(seconds.max(0.001)));
            }
            if let Some(bytes) = max_output_bytes {
                shell = shell.with_max_output_bytes(*bytes);
            }
            if *inherit_env {
                for (name, value) in std::env::vars() {
                    shell = shell.with_env(name, value);
                }
            }
            for (name, value) in env {
                shell = shell.with_env(name.clone(), value.clone());
            }
            if *sandbox {
                shell = shell.with_sandbox(Policy::workspace_write(root));
            }
            Arc::new(shell)
        }
        BackendConfig::Store {
            namespace,
            store: own,
            namespace_fn,
        } => {
            let own = own
                .map(|index| storage(objects, index, |s| s.store.clone()))
                .transpose()?;
            let store = own.as_ref().or(store).ok_or(
                "StoreBackend needs a store: pass store=InMemoryStore() (or SqliteStore, PostgresStore) to create_deep_agent or to StoreBackend",
            )?;
            let mut backend = StoreBackend::new(Arc::clone(store));
            if let Some(namespace) = namespace.clone() {
                backend = backend.with_namespace(move |_| namespace.clone());
            }
            if let Some(index) = namespace_fn {
                let function = Arc::clone(
                    objects
                        .get(*index)
                        .ok_or("a StoreBackend namespace refers to no object")?,
                );
                backend = backend.with_namespace(move |cx| namespace_of(&function, cx));
            }
            Arc::new(backend)
        }
        BackendConfig::Composite { default, routes } => {
            let mut composite = CompositeBackend::new(backend_of(default, objects, store)?);
            for (prefix, route) in routes {
                composite = composite
                    .route(prefix, backend_of(route, objects, store)?)
                    .map_err(|e| format!("CompositeBackend route {prefix:?}: {e}"))?;
            }
            Arc::new(composite)
        }
        BackendConfig::Python { object, execute } => Arc::new(PyBackend {
            adapter: Arc::clone(
                objects
                    .get(*object)
                    .ok_or("a Python backend refers to no object")?,
            ),
            executes: *execute,
        }),
    })
}

/// The namespace a Python function of the runtime answers for the call `cx` (empty, which
/// the store backend refuses, when the function fails or answers something else).
fn namespace_of(function: &Py<PyAny>, cx: &BackendContext) -> Vec<String> {
    Python::attach(|py| {
        let context = cx
            .runtime
            .get::<Arc<RunData>>()
            .map_or_else(|| py.None(), |data| data.context.clone_ref(py));
        function
            .call1(py, (context, cx.thread_id.clone(), cx.assistant_id.clone()))
            .and_then(|answer| answer.extract::<Vec<String>>(py))
            .unwrap_or_default()
    })
}

/// The backend `config` (JSON) describes, built for calls from Python outside a run
/// ([`crate::direct::NativeBackend`]): a store backend needs its own `store=`.
pub fn standalone_backend(
    config: &str,
    objects: &[Arc<Py<PyAny>>],
) -> Result<Arc<dyn Backend>, String> {
    let config: BackendConfig =
        serde_json::from_str(config).map_err(|e| format!("invalid backend: {e}"))?;
    backend_of(&config, objects, None)
}

fn filesystem(root_dir: &Option<PathBuf>, virtual_mode: bool) -> Result<FilesystemBackend, String> {
    let root = root(root_dir)?;
    FilesystemBackend::builder(&root)
        .virtual_mode(virtual_mode)
        .build()
        .map_err(|e| format!("FilesystemBackend(root_dir={}): {e}", root.display()))
}

/// An opened store or checkpointer, owned by the Python object that describes it, so agents
/// given the same object share it (two agents on one `InMemorySaver()` see one set of
/// threads).
#[pyclass(frozen, module = "deepagents_rs._native")]
pub struct NativeStorage {
    store: Option<Arc<dyn Store>>,
    checkpointer: Option<Arc<dyn Checkpointer>>,
}

#[pymethods]
impl NativeStorage {
    /// Opens `config` (JSON) as a `store` or a `checkpointer`.
    #[new]
    fn new(py: Python<'_>, config: &str, role: &str) -> PyResult<Self> {
        let config: StorageConfig = serde_json::from_str(config).map_err(|e| {
            pyo3::exceptions::PyValueError::new_err(format!("invalid storage: {e}"))
        })?;
        let runtime = crate::runtime()?;
        let opened = py.detach(|| {
            runtime.block_on(async {
                Ok::<_, String>(match role {
                    "store" => Self {
                        store: Some(open_store(&config).await?),
                        checkpointer: None,
                    },
                    _ => Self {
                        store: None,
                        checkpointer: Some(open_checkpointer(&config).await?),
                    },
                })
            })
        });
        opened.map_err(pyo3::exceptions::PyValueError::new_err)
    }

    /// A checkpointer whose threads live in a Python object (LangGraph's
    /// `BaseCheckpointSaver`), through `adapter`
    /// (`deepagents_rs._backends.LangGraphSaverAdapter`).
    #[staticmethod]
    fn python_checkpointer(adapter: Py<PyAny>) -> Self {
        Self {
            store: None,
            checkpointer: Some(Arc::new(crate::saver::PyCheckpointer {
                adapter: Arc::new(adapter),
                leases: deepagents::core::LocalLeases::new(),
            })),
        }
    }

    /// A store whose items live in a Python object (LangGraph's `BaseStore`), through
    /// `adapter` (`deepagents_rs._backends.LangGraphStoreAdapter`).
    #[staticmethod]
    fn python_store(adapter: Py<PyAny>) -> Self {
        Self {
            store: Some(Arc::new(crate::store::PyStore {
                adapter: Arc::new(adapter),
            })),
            checkpointer: None,
        }
    }
}

fn storage<T: ?Sized>(
    objects: &[Arc<Py<PyAny>>],
    index: usize,
    pick: impl Fn(&NativeStorage) -> Option<Arc<T>>,
) -> Result<Arc<T>, String> {
    let object = objects.get(index).ok_or("a storage refers to no object")?;
    Python::attach(|py| {
        let storage = object
            .bind(py)
            .extract::<PyRef<'_, NativeStorage>>()
            .map_err(|e| format!("not a storage: {e}"))?;
        pick(&storage).ok_or_else(|| {
            "a store was given as checkpointer, or a saver as store: use InMemorySaver/SqliteSaver/PostgresSaver for checkpointer=, InMemoryStore/SqliteStore/PostgresStore for store=".to_owned()
        })
    })
}

async fn open_store(config: &StorageConfig) -> Result<Arc<dyn Store>, String> {
    Ok(match config {
        StorageConfig::Memory => Arc::new(InMemoryStore::new()),
        StorageConfig::Sqlite { path } => Arc::new(
            SqliteStore::open(path)
                .await
                .map_err(|e| format!("SqliteStore({}): {e}", path.display()))?,
        ),
        StorageConfig::Postgres { url } => Arc::new(
            PostgresStore::connect(url)
                .await
                .map_err(|e| format!("PostgresStore: {e}"))?,
        ),
    })
}

async fn open_checkpointer(config: &StorageConfig) -> Result<Arc<dyn Checkpointer>, String> {
    Ok(match config {
        StorageConfig::Memory => Arc::new(InMemoryCheckpointer::default()),
        StorageConfig::Sqlite { path } => Arc::new(
            SqliteStore::open(path)
                .await
                .map_err(|e| format!("SqliteSaver({}): {e}", path.display()))?
                .checkpointer(),
        ),
        StorageConfig::Postgres { url } => Arc::new(
            PostgresStore::connect(url)
                .await
                .map_err(|e| format!("PostgresSaver: {e}"))?
                .checkpointer(),
        ),
    })
}
