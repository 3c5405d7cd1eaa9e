//! A backend written in Python: the file tools' calls go to an object with the reference
//! protocol's methods, through the package's adapter (`deepagents_rs._backends`), which
//! answers every operation as JSON: `{"ok": …}` or `{"error": {"kind", "message"}}`.

use std::sync::Arc;

use async_trait::async_trait;
use std::time::Duration;

use deepagents::backends::{
    Backend, BackendContext, BackendError, Changed, ExecuteResult, FileInfo, GlobResult, GrepMatch,
    GrepQuery, GrepResult, OutputSink, RawFile, ReadResult, Sandbox, VPath,
};
use pyo3::prelude::*;
use serde_json::{Value, json};

/// The adapter around a Python backend object.
pub struct PyBackend {
    pub adapter: Arc<Py<PyAny>>,
    /// Whether the object has `execute` (the reference's sandbox protocol): then the agent
    /// gets the `execute` tool.
    pub executes: bool,
}

impl PyBackend {
    /// Runs `op` on the Python object, on a blocking-pool thread.
    async fn call(&self, op: &'static str, path: &str, args: Value) -> Result<Value, BackendError> {
        let mut answer = crate::call_adapter(&self.adapter, op, args)
            .await
            .map_err(|why| BackendError::Io {
                operation: op,
                path: path.to_owned(),
                message: format!("the Python backend {why}"),
            })?;
        if let Some(error) = answer.get("error").filter(|e| !e.is_null()) {
            let text = |key: &str| error.get(key).and_then(Value::as_str).unwrap_or_default();
            let path = path.to_owned();
            return Err(match text("kind") {
                "not_found" => BackendError::NotFound { path },
                "is_directory" => BackendError::IsDirectory { path },
                "exists" => BackendError::AlreadyExists { path },
                "not_a_directory" => BackendError::NotADirectory { path },
                "string_not_found" => BackendError::StringNotFound { path },
                "not_unique" => BackendError::NotUnique {
                    path,
                    count: error.get("count").and_then(Value::as_u64).unwrap_or(2) as usize,
                },
                "permission_denied" => BackendError::PermissionDenied {
                    path,
                    reason: text("message").to_owned(),
                },
                _ => BackendError::Io {
                    operation: op,
                    path,
                    message: text("message").to_owned(),
                },
            });
        }
        Ok(answer.get_mut("ok").map(Value::take).unwrap_or(Value::Null))
    }
}

fn infos(value: Value) -> Result<Vec<FileInfo>, BackendError> {
    serde_json::from_value(value).map_err(|e| BackendError::Io {
        operation: "ls",
        path: "/".to_owned(),
        message: format!("the Python backend listed entries badly: {e}"),
    })
}

#[async_trait]
impl Backend for PyBackend {
    fn name(&self) -> &'static str {
        "python"
    }

    async fn ls(&self, _cx: &BackendContext, path: &VPath) -> Result<Vec<FileInfo>, BackendError> {
        let mut entries = infos(
            self.call("ls", path.as_str(), json!({"path": path.as_str()}))
                .await?,
        )?;
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(entries)
    }

    async fn read(
        &self,
        _cx: &BackendContext,
        path: &VPath,
        offset: usize,
        limit: usize,
    ) -> Result<ReadResult, BackendError> {
        let text = self
            .call("read", path.as_str(), json!({"path": path.as_str()}))
            .await?;
        let text = text.as_str().unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        Ok(ReadResult::Text {
            lines: all
                .iter()
                .skip(offset)
                .take(limit)
                .map(|line| (*line).to_owned())
                .collect(),
            offset,
            total_lines: all.len(),
        })
    }

    /// The file's text as the backend returned it (the default would rebuild it from lines,
    /// ending it with a newline it may not have).
    async fn read_raw(&self, _cx: &BackendContext, path: &VPath) -> Result<RawFile, BackendError> {
        let text = self
            .call("read", path.as_str(), json!({"path": path.as_str()}))
            .await?;
        Ok(RawFile {
            mime_type: deepagents::backends::mime::TEXT_MIME.to_owned(),
            data: text.as_str().unwrap_or_default().as_bytes().to_vec(),
        })
    }

    async fn write(
        &self,
        _cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        self.call(
            "write",
            path.as_str(),
            json!({"path": path.as_str(), "content": content}),
        )
        .await?;
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
        let count = self
            .call(
                "edit",
                path.as_str(),
                json!({"path": path.as_str(), "old": old, "new": new, "replace_all": replace_all}),
            )
            .await?;
        Ok(Changed::outside_state(count.as_u64().unwrap_or(1) as usize))
    }

    async fn delete(
        &self,
        _cx: &BackendContext,
        path: &VPath,
    ) -> Result<Changed<usize>, BackendError> {
        let count = self
            .call("delete", path.as_str(), json!({"path": path.as_str()}))
            .await?;
        Ok(Changed::outside_state(count.as_u64().unwrap_or(1) as usize))
    }

    async fn glob(
        &self,
        _cx: &BackendContext,
        pattern: &str,
        base: &VPath,
    ) -> Result<GlobResult, BackendError> {
        let files = infos(
            self.call(
                "glob",
                base.as_str(),
                json!({"pattern": pattern, "path": base.as_str()}),
            )
            .await?,
        )?;
        Ok(GlobResult {
            files: files.into_iter().filter(|f| !f.is_dir).collect(),
            truncated: false,
        })
    }

    async fn grep(
        &self,
        _cx: &BackendContext,
        query: &GrepQuery,
    ) -> Result<GrepResult, BackendError> {
        let found = self
            .call(
                "grep",
                query.path.as_str(),
                json!({
                    "pattern": query.pattern,
                    "path": query.path.as_str(),
                    "glob": query.include,
                    "regex": query.regex,
                    "case_insensitive": query.case_insensitive,
                }),
            )
            .await?;
        let mut matches: Vec<GrepMatch> =
            serde_json::from_value(found).map_err(|e| BackendError::Io {
                operation: "grep",
                path: query.path.as_str().to_owned(),
                message: format!("the Python backend reported matches badly: {e}"),
            })?;
        let truncated = matches.len() > query.max_count;
        // (`max_count` bounds what the model sees; the object may not know the cap.)
        matches.truncate(query.max_count);
        Ok(GrepResult {
            matches,
            truncated,
            ..GrepResult::default()
        })
    }

    fn as_sandbox(&self) -> Option<&dyn Sandbox> {
        if self.executes { Some(self) } else { None }
    }
}

#[async_trait]
impl Sandbox for PyBackend {
    fn id(&self) -> &str {
        "python"
    }

    async fn execute_streaming(
        &self,
        _cx: &BackendContext,
        command: &str,
        timeout: Option<Duration>,
        on_output: &OutputSink<'_>,
    ) -> Result<ExecuteResult, BackendError> {
        let done = self
            .call(
                "execute",
                "/",
                json!({"command": command, "timeout": timeout.map(|t| t.as_secs_f64())}),
            )
            .await?;
        let output = done
            .get("output")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        on_output(deepagents::core::event::OutputStream::Stdout, &output);
        Ok(ExecuteResult {
            output,
            exit_code: done
                .get("exit_code")
                .and_then(Value::as_i64)
                .and_then(|code| i32::try_from(code).ok()),
            truncated: done.get("truncated").and_then(Value::as_bool) == Some(true),
            timed_out: false,
        })
    }
}
