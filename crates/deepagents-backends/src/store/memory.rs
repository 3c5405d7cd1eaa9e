//! A store in memory, for tests and single-process use.

use std::collections::BTreeMap;
use std::sync::{PoisonError, RwLock};

use async_trait::async_trait;
use serde_json::Value;

use super::{SearchQuery, Store, StoreError, StoreItem, validate_item, validate_namespace};
use crate::memory::now_ms;

/// A [`Store`] in process memory; cheap to create, gone when dropped.
#[derive(Debug, Default)]
pub struct InMemoryStore {
    items: RwLock<BTreeMap<(Vec<String>, String), StoreItem>>,
}

impl InMemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl Store for InMemoryStore {
    async fn get(&self, namespace: &[String], key: &str) -> Result<Option<StoreItem>, StoreError> {
        validate_item(namespace, key)?;
        let items = self.items.read().unwrap_or_else(PoisonError::into_inner);
        Ok(items.get(&(namespace.to_vec(), key.to_owned())).cloned())
    }

    async fn put(&self, namespace: &[String], key: &str, value: Value) -> Result<(), StoreError> {
        validate_item(namespace, key)?;
        let now = now_ms();
        let mut items = self.items.write().unwrap_or_else(PoisonError::into_inner);
        let created_at_ms = items
            .get(&(namespace.to_vec(), key.to_owned()))
            .map_or(now, |item| item.created_at_ms);
        items.insert(
            (namespace.to_vec(), key.to_owned()),
            StoreItem {
                namespace: namespace.to_vec(),
                key: key.to_owned(),
                value,
                created_at_ms,
                updated_at_ms: now,
            },
        );
        Ok(())
    }

    async fn merge(
        &self,
        namespace: &[String],
        key: &str,
        patch: &Value,
    ) -> Result<Option<StoreItem>, StoreError> {
        validate_item(namespace, key)?;
        let mut items = self.items.write().unwrap_or_else(PoisonError::into_inner);
        let Some(item) = items.get_mut(&(namespace.to_vec(), key.to_owned())) else {
            return Ok(None);
        };
        super::merge_patch(&mut item.value, patch);
        item.updated_at_ms = now_ms();
        Ok(Some(item.clone()))
    }

    async fn delete(&self, namespace: &[String], key: &str) -> Result<bool, StoreError> {
        validate_item(namespace, key)?;
        let mut items = self.items.write().unwrap_or_else(PoisonError::into_inner);
        Ok(items
            .remove(&(namespace.to_vec(), key.to_owned()))
            .is_some())
    }

    async fn search(
        &self,
        namespace_prefix: &[String],
        query: &SearchQuery,
    ) -> Result<Vec<StoreItem>, StoreError> {
        if !namespace_prefix.is_empty() {
            validate_namespace(namespace_prefix)?;
        }
        let items = self.items.read().unwrap_or_else(PoisonError::into_inner);
        Ok(items
            .values()
            .filter(|item| {
                item.namespace.starts_with(namespace_prefix)
                    && item.key.starts_with(&query.key_prefix)
            })
            .skip(query.offset)
            .take(query.limit)
            .cloned()
            .collect())
    }
}
