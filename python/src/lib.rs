//! `deepagents_rs._native`: the Rust half of the Python package.
//!
//! The Python half (`deepagents_rs/`) turns `create_deep_agent`'s arguments into a JSON
//! configuration plus the Python objects it refers to by index (tools, backends), and turns
//! what comes back (frames of the stream modes, as JSON) into Python values. This half
//! builds the agent ([`config`]; a LangChain chat model object's settings become a native
//! client in [`model`]), drives its runs on a Tokio runtime of its own with the GIL
//! released ([`run`]), and calls back into Python for tools ([`tool`]) and backends
//! ([`backend`]), holding the GIL only while Python code runs.

mod backend;
mod config;
mod direct;
mod middleware;
mod model;
mod run;
mod saver;
mod store;
mod tool;

use std::sync::OnceLock;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// Calls `adapter.call(op, args)` — the JSON protocol of the package's Python adapters for
/// backends, stores and savers — on a blocking-pool thread, so the loop's workers never wait
/// for the GIL; returns the answer read as JSON, or what went wrong, for the caller to name.
async fn call_adapter(
    adapter: &std::sync::Arc<Py<PyAny>>,
    op: &'static str,
    args: serde_json::Value,
) -> Result<serde_json::Value, String> {
    let adapter = std::sync::Arc::clone(adapter);
    let answer = tokio::task::spawn_blocking(move || {
        Python::attach(|py| -> PyResult<String> {
            adapter
                .call_method1(py, "call", (op, args.to_string()))?
                .extract(py)
        })
    })
    .await
    .map_err(|e| format!("crashed: {e}"))?
    .map_err(|e| format!("the adapter failed: {e}"))?;
    serde_json::from_str(&answer).map_err(|e| format!("answered badly: {e}"))
}

/// The value of an adapter's `{"ok": …}` answer, or the text of its `{"error": "…"}`.
fn adapter_ok(mut answer: serde_json::Value) -> Result<serde_json::Value, String> {
    if let Some(error) = answer.get("error").and_then(serde_json::Value::as_str) {
        return Err(error.to_owned());
    }
    Ok(answer
        .get_mut("ok")
        .map(serde_json::Value::take)
        .unwrap_or(serde_json::Value::Null))
}

/// The runtime every agent of the process runs on: started on first use, two workers at
/// least (a Python tool blocks a blocking-pool thread, never a worker).
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(
                    std::thread::available_parallelism()
                        .map_or(2, |n| n.get())
                        .max(2),
                )
                .thread_name("deepagents")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the agent runtime: {e}")))
}

/// The module.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<run::NativeAgent>()?;
    module.add_class::<config::NativeStorage>()?;
    module.add_class::<direct::NativeBackend>()?;
    module.add_class::<run::NativeStream>()?;
    module.add_class::<tool::ToolCall>()?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
