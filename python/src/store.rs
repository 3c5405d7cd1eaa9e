//! A store written in Python: LangGraph's `BaseStore` objects (`InMemoryStore()` and the rest)
//! used as the agent's store, so what the user puts in theirs the agent reads, and the
//! reverse. The package's adapter (`deepagents_rs._backends.LangGraphStoreAdapter`) answers
//! every operation as JSON: `{"ok": …}` or `{"error": "…"}`.

use std::sync::Arc;

use async_trait::async_trait;
use deepagents::backends::Store;
use deepagents::backends::store::{SearchQuery, StoreError, StoreItem};
use pyo3::prelude::*;
use serde_json::{Value, json};

/// The adapter around a Python store object.
pub struct PyStore {
    pub adapter: Arc<Py<PyAny>>,
}

impl PyStore {
    /// Runs `op` on the Python object, on a blocking-pool thread.
    async fn call(&self, op: &'static str, args: Value) -> Result<Value, StoreError> {
        crate::call_adapter(&self.adapter, op, args)
            .await
            .and_then(crate::adapter_ok)
            .map_err(|why| StoreError::Storage(format!("the Python store's {op}: {why}")))
    }
}

fn item(value: Value) -> Result<StoreItem, StoreError> {
    serde_json::from_value(value)
        .map_err(|e| StoreError::Storage(format!("the Python store gave an unreadable item: {e}")))
}

#[async_trait]
impl Store for PyStore {
    async fn get(&self, namespace: &[String], key: &str) -> Result<Option<StoreItem>, StoreError> {
        match self
            .call("get", json!({"namespace": namespace, "key": key}))
            .await?
        {
            Value::Null => Ok(None),
            found => item(found).map(Some),
        }
    }

    async fn put(&self, namespace: &[String], key: &str, value: Value) -> Result<(), StoreError> {
        deepagents::backends::store::validate_item(namespace, key)?;
        self.call(
            "put",
            json!({"namespace": namespace, "key": key, "value": value}),
        )
        .await
        .map(drop)
    }

    async fn delete(&self, namespace: &[String], key: &str) -> Result<bool, StoreError> {
        let existed = self
            .call("delete", json!({"namespace": namespace, "key": key}))
            .await?;
        Ok(existed.as_bool().unwrap_or(false))
    }

    async fn search(
        &self,
        namespace_prefix: &[String],
        query: &SearchQuery,
    ) -> Result<Vec<StoreItem>, StoreError> {
        let found = self
            .call(
                "search",
                json!({
                    "namespace_prefix": namespace_prefix,
                    "key_prefix": query.key_prefix,
                    "offset": query.offset,
                    "limit": query.limit,
                }),
            )
            .await?;
        match found {
            Value::Array(items) => items.into_iter().map(item).collect(),
            Value::Null => Ok(Vec::new()),
            other => Err(StoreError::Storage(format!(
                "the Python store's search answered {other} instead of a list"
            ))),
        }
    }
}
