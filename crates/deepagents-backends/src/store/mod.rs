//! Stores: namespaced key-value storage shared across threads, and the backend over them.

mod backend;
#[cfg(feature = "sqlite")]
mod file_lock;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod group_commit;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use backend::{NamespaceFn, StoreBackend};
pub use memory::InMemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresCheckpointer, PostgresStore};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteCheckpointer, SqliteStore};

/// One stored value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoreItem {
    /// Its namespace, e.g. `["users", "alice", "memories"]`.
    pub namespace: Vec<String>,
    /// Its key within the namespace.
    pub key: String,
    /// The value.
    pub value: Value,
    /// First written, in milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Last written, in milliseconds since the Unix epoch.
    pub updated_at_ms: u64,
}

/// A page of a prefix search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchQuery {
    /// Only keys starting with this.
    pub key_prefix: String,
    /// Items to skip.
    pub offset: usize,
    /// Most items to return.
    pub limit: usize,
}

impl Default for SearchQuery {
    fn default() -> Self {
        Self {
            key_prefix: String::new(),
            offset: 0,
            limit: 100,
        }
    }
}

/// A store operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A namespace component is empty or has a character outside `A-Z a-z 0-9 - _ . @ + : ~`.
    #[error("invalid namespace {namespace:?}: {reason}")]
    InvalidNamespace {
        /// The namespace as given.
        namespace: Vec<String>,
        /// What is wrong.
        reason: String,
    },
    /// A key is empty, too long, or holds a NUL character.
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey {
        /// The key as given.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The storage itself failed.
    #[error("store error: {0}")]
    Storage(String),
}

/// The longest key and namespace component accepted, in bytes: what every store can index
/// (PostgreSQL's index rows hold about 2.7 KB).
pub const MAX_KEY_LEN: usize = 1024;

/// Checks an item's address: its namespace (see [`validate_namespace`]) and its key, which
/// must be non-empty, at most [`MAX_KEY_LEN`] bytes and free of NUL (which SQL text cannot
/// hold), so every store takes the same keys.
pub fn validate_item(namespace: &[String], key: &str) -> Result<(), StoreError> {
    validate_namespace(namespace)?;
    let refuse = |reason: String| StoreError::InvalidKey {
        key: key.chars().take(64).collect(),
        reason,
    };
    if key.is_empty() {
        return Err(refuse("a key must not be empty".to_owned()));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(refuse(format!(
            "it is {} bytes long; use at most {MAX_KEY_LEN}",
            key.len()
        )));
    }
    if key.contains('\0') {
        return Err(refuse("it holds a NUL character".to_owned()));
    }
    Ok(())
}

/// Checks a namespace: at least one component; each non-empty and made only of letters,
/// digits and `- _ . @ + : ~` (so wildcards and separators can never be smuggled in).
pub fn validate_namespace(namespace: &[String]) -> Result<(), StoreError> {
    let refuse = |reason: String| StoreError::InvalidNamespace {
        namespace: namespace.to_vec(),
        reason,
    };
    if namespace.is_empty() {
        return Err(refuse(
            "a namespace needs at least one component".to_owned(),
        ));
    }
    for component in namespace {
        if component.is_empty() {
            return Err(refuse("components must not be empty".to_owned()));
        }
        if component.len() > MAX_KEY_LEN {
            return Err(refuse(format!(
                "a component is {} bytes long; use at most {MAX_KEY_LEN}",
                component.len()
            )));
        }
        if let Some(bad) = component
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "-_.@+:~".contains(*c)))
        {
            return Err(refuse(format!(
                "`{bad}` is not allowed in `{component}`; use letters, digits and - _ . @ + : ~"
            )));
        }
    }
    Ok(())
}

/// Applies `patch` to `target` as a JSON merge patch (RFC 7396), as [`Store::merge`] does.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(object) = target {
        for (name, value) in fields {
            if value.is_null() {
                object.remove(name);
            } else {
                merge_patch(object.entry(name.as_str()).or_insert(Value::Null), value);
            }
        }
    }
}

/// Namespaced key-value storage with prefix search.
#[async_trait]
pub trait Store: Send + Sync {
    /// The item at `key` in `namespace`.
    async fn get(&self, namespace: &[String], key: &str) -> Result<Option<StoreItem>, StoreError>;

    /// Creates or replaces the item at `key`.
    async fn put(&self, namespace: &[String], key: &str, value: Value) -> Result<(), StoreError>;

    /// Applies `patch` to the item at `key` as a JSON merge patch (RFC 7396: the patch's
    /// fields replace the item's, objects merge field by field, a `null` field removes one)
    /// and returns the item as it is now; `None`, with nothing written, when there is none.
    /// The stores of this crate read and write the item in one step that no other write of
    /// it comes between; the default reads it, then puts the result.
    async fn merge(
        &self,
        namespace: &[String],
        key: &str,
        patch: &Value,
    ) -> Result<Option<StoreItem>, StoreError> {
        let Some(mut item) = self.get(namespace, key).await? else {
            return Ok(None);
        };
        merge_patch(&mut item.value, patch);
        self.put(namespace, key, item.value.clone()).await?;
        Ok(Some(item))
    }

    /// Removes the item at `key`; returns whether it existed.
    async fn delete(&self, namespace: &[String], key: &str) -> Result<bool, StoreError>;

    /// Items whose namespace starts with `namespace_prefix` (component-wise) and whose key
    /// starts with `query.key_prefix`, ordered by namespace then key, one page at a time.
    async fn search(
        &self,
        namespace_prefix: &[String],
        query: &SearchQuery,
    ) -> Result<Vec<StoreItem>, StoreError>;

    /// Closes the store's connections cleanly (a SQLite database folds its write-ahead log
    /// back into the file); later calls fail. Call it before the program exits. Stores without
    /// connections do nothing.
    async fn close(&self) {}
}
