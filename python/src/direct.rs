//! A built-in backend called directly from Python, outside any run: what
//! `FilesystemBackend(root_dir=…).read("/a.txt")` and the other protocol methods of the
//! package's backend classes call. The backend is built from the same description an agent
//! is given ([`crate::config::standalone_backend`]); changes a state backend makes go to a
//! scratch state kept by this object.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deepagents::backends::{Backend, BackendContext, BackendError, GrepQuery, VPath};
use deepagents::{AgentState, StateUpdate};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde_json::{Value, json};

/// A file's bytes, or the error code of reading it.
type Downloaded = (Option<Py<PyBytes>>, Option<String>);

/// One built-in backend, answering the protocol's operations as JSON.
#[pyclass(frozen, module = "deepagents_rs._native")]
pub struct NativeBackend {
    backend: Arc<dyn Backend>,
    /// The files of state backends in this tree (a scratch state: no thread's).
    state: Mutex<Arc<AgentState>>,
}

impl NativeBackend {
    fn context(&self) -> BackendContext {
        let state = self
            .state
            .lock()
            .map(|s| Arc::clone(&s))
            .unwrap_or_default();
        BackendContext::with_state(state)
    }

    fn apply(&self, update: StateUpdate) {
        if update.files.is_empty() {
            return;
        }
        if let Ok(mut state) = self.state.lock() {
            let mut next = AgentState::clone(&state);
            for (key, file) in update.files {
                match file {
                    Some(file) => next.files.insert(key, file),
                    None => next.files.remove(&key),
                };
            }
            *state = Arc::new(next);
        }
    }

    async fn run(&self, op: &str, args: &Value) -> Result<Value, BackendError> {
        let cx = self.context();
        let text = |key: &str| args.get(key).and_then(Value::as_str).unwrap_or_default();
        let path = || VPath::parse(text("path")).map_err(BackendError::from);
        Ok(match op {
            "ls" => json!(self.backend.ls(&cx, &path()?).await?),
            "read" => {
                let number = |key: &str| {
                    args.get(key)
                        .and_then(Value::as_u64)
                        .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX))
                };
                let page = self
                    .backend
                    .read(&cx, &path()?, number("offset"), number("limit"))
                    .await?;
                json!(page)
            }
            "write" => {
                let changed = self
                    .backend
                    .overwrite(&cx, &path()?, text("content"))
                    .await?;
                self.apply(changed.update);
                Value::Null
            }
            "edit" => {
                let replace_all = args.get("replace_all").and_then(Value::as_bool);
                let changed = self
                    .backend
                    .edit(
                        &cx,
                        &path()?,
                        text("old"),
                        text("new"),
                        replace_all == Some(true),
                    )
                    .await?;
                self.apply(changed.update);
                json!(changed.value)
            }
            "delete" => {
                let changed = self.backend.delete(&cx, &path()?).await?;
                self.apply(changed.update);
                json!(changed.value)
            }
            "glob" => json!(self.backend.glob(&cx, text("pattern"), &path()?).await?),
            "grep" => {
                let mut query = GrepQuery::literal(text("pattern"), path()?);
                query.include = args.get("glob").and_then(Value::as_str).map(str::to_owned);
                if let Some(max) = args.get("max_count").and_then(Value::as_u64) {
                    query.max_count = usize::try_from(max).unwrap_or(usize::MAX);
                }
                json!(self.backend.grep(&cx, &query).await?)
            }
            "execute" => {
                let sandbox = self.backend.as_sandbox().ok_or(BackendError::Unsupported {
                    operation: "execute",
                    backend: self.backend.name(),
                })?;
                let timeout = args
                    .get("timeout")
                    .and_then(Value::as_f64)
                    .map(|seconds| Duration::from_secs_f64(seconds.max(0.001)));
                json!(sandbox.execute(&cx, text("command"), timeout).await?)
            }
            _ => {
                return Err(BackendError::InvalidQuery {
                    what: "operation",
                    message: op.to_owned(),
                });
            }
        })
    }
}

/// The adapter's error kinds (see `deepagents_rs._backends`).
fn kind(error: &BackendError) -> &'static str {
    match error {
        BackendError::NotFound { .. } => "not_found",
        BackendError::IsDirectory { .. } => "is_directory",
        BackendError::AlreadyExists { .. } => "exists",
        BackendError::NotADirectory { .. } => "not_a_directory",
        BackendError::StringNotFound { .. } => "string_not_found",
        BackendError::NotUnique { .. } => "not_unique",
        BackendError::PermissionDenied { .. } => "permission_denied",
        BackendError::InvalidPath(_) => "invalid_path",
        BackendError::Unsupported { .. } => "unsupported",
        _ => "other",
    }
}

#[pymethods]
impl NativeBackend {
    /// Builds the backend `config` (JSON, as for an agent) describes; `objects` are the
    /// Python objects it refers to by index (Python backends, stores).
    #[new]
    fn new(config: &str, objects: Vec<Py<PyAny>>) -> PyResult<Self> {
        let objects: Vec<Arc<Py<PyAny>>> = objects.into_iter().map(Arc::new).collect();
        let backend =
            crate::config::standalone_backend(config, &objects).map_err(PyValueError::new_err)?;
        Ok(Self {
            backend,
            state: Mutex::new(Arc::new(AgentState::default())),
        })
    }

    /// Runs `op` (`ls`, `read`, `write`, `edit`, `delete`, `glob`, `grep`, `execute`) with `args`
    /// (JSON); answers `{"ok": …}` or `{"error": {"kind", "message", "count"}}` as JSON.
    fn call(&self, py: Python<'_>, op: &str, args: &str) -> PyResult<String> {
        let args: Value = serde_json::from_str(args)
            .map_err(|e| PyValueError::new_err(format!("invalid arguments: {e}")))?;
        let runtime = crate::runtime()?;
        let answer = py.detach(|| runtime.block_on(self.run(op, &args)));
        Ok(match answer {
            Ok(value) => json!({ "ok": value }),
            Err(error) => {
                let count = match &error {
                    BackendError::NotUnique { count, .. } => Some(*count),
                    _ => None,
                };
                json!({"error": {"kind": kind(&error), "message": error.to_string(), "count": count}})
            }
        }
        .to_string())
    }

    /// Reads files as bytes: `(data, None)` or `(None, error code)` per path, in order.
    fn download(&self, py: Python<'_>, paths: Vec<String>) -> PyResult<Vec<Downloaded>> {
        let runtime = crate::runtime()?;
        let cx = self.context();
        let answers = py.detach(|| runtime.block_on(self.backend.download_files(&cx, paths)));
        Ok(answers
            .into_iter()
            .map(|answer| match answer {
                Ok(data) => (Some(PyBytes::new(py, &data).unbind()), None),
                Err(code) => (None, Some(code_name(&json!(code)))),
            })
            .collect())
    }

    /// Writes files from bytes, creating or replacing each: `None` or an error code per file.
    fn upload(
        &self,
        py: Python<'_>,
        files: Vec<(String, Vec<u8>)>,
    ) -> PyResult<Vec<Option<String>>> {
        let runtime = crate::runtime()?;
        let cx = self.context();
        let changed = py.detach(|| runtime.block_on(self.backend.upload_files(&cx, files)));
        self.apply(changed.update);
        Ok(changed
            .value
            .into_iter()
            .map(|answer| answer.err().map(|code| code_name(&json!(code))))
            .collect())
    }
}

fn code_name(code: &Value) -> String {
    code.as_str().unwrap_or("invalid_path").to_owned()
}
