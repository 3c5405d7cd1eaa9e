//! The store: items under namespaces, per tenant.

use std::collections::BTreeSet;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};

use super::request::{Count, Namespace, Object, Typed, TypedQuery, count_or};
use super::{AppState, Shared, Tenant, matches};
use crate::error::{ApiError, ApiResult};
use crate::time::rfc3339;

pub(super) fn store_ns(tenant: &Tenant, namespace: &[String]) -> Vec<String> {
    let mut full = vec!["store".to_owned(), tenant.0.clone()];
    full.extend(namespace.iter().cloned());
    full
}

/// The payload of `PUT /store/items`.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct ItemPut {
    namespace: Namespace,
    key: Option<String>,
    value: Option<Value>,
}

/// The payload of `DELETE /store/items`.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct ItemDelete {
    namespace: Namespace,
    key: Option<String>,
}

/// The payload of `POST /store/items/search`.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct ItemSearch {
    namespace_prefix: Namespace,
    filter: Option<Object>,
    query: Option<String>,
    limit: Option<Count>,
    offset: Option<Count>,
}

/// The payload of `POST /store/namespaces`.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct NamespaceSearch {
    prefix: Namespace,
    suffix: Namespace,
    max_depth: Option<Count>,
    limit: Option<Count>,
    offset: Option<Count>,
}

pub(super) fn item_json(item: &deepagents::backends::store::StoreItem) -> Value {
    json!({
        "namespace": item.namespace.iter().skip(2).collect::<Vec<_>>(),
        "key": item.key,
        "value": item.value,
        "created_at": rfc3339(item.created_at_ms),
        "updated_at": rfc3339(item.updated_at_ms),
    })
}

pub(super) async fn store_put(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Typed(put): Typed<ItemPut>,
) -> ApiResult<StatusCode> {
    let namespace = put.namespace.0;
    if namespace.is_empty() {
        return Err(ApiError::invalid("`namespace` needs at least one label"));
    }
    // Reads name a namespace as its labels joined by dots (`GET /store/items?namespace=a.b`),
    // so an item under a label with a dot could be written but never read back.
    if let Some(label) = namespace
        .iter()
        .find(|label| label.is_empty() || label.contains('.'))
    {
        return Err(ApiError::invalid(format!(
            "namespace label `{label}` cannot be empty or hold a dot (reads join labels with dots); use another separator"
        )));
    }
    let key = put
        .key
        .ok_or_else(|| ApiError::invalid("`key` is missing"))?;
    let value = put
        .value
        .ok_or_else(|| ApiError::invalid("`value` is missing"))?;
    shared
        .store
        .put(&store_ns(&tenant, &namespace), &key, value)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
pub(super) struct ItemQuery {
    namespace: Option<String>,
    key: String,
}

pub(super) async fn store_get(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    TypedQuery(query): TypedQuery<ItemQuery>,
) -> ApiResult<Json<Value>> {
    let namespace: Vec<String> = query
        .namespace
        .as_deref()
        .unwrap_or_default()
        .split('.')
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    let item = shared
        .store
        .get(&store_ns(&tenant, &namespace), &query.key)
        .await?;
    item.map(|item| Json(item_json(&item))).ok_or_else(|| {
        ApiError::not_found(format!("item `{}` in namespace {namespace:?}", query.key))
    })
}

pub(super) async fn store_delete(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Typed(delete): Typed<ItemDelete>,
) -> ApiResult<StatusCode> {
    let key = delete
        .key
        .ok_or_else(|| ApiError::invalid("`key` is missing"))?;
    shared
        .store
        .delete(&store_ns(&tenant, &delete.namespace.0), &key)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Every item under `prefix` of the tenant's store.
pub(super) async fn items_under(
    shared: &Shared,
    tenant: &Tenant,
    prefix: &[String],
) -> ApiResult<Vec<deepagents::backends::store::StoreItem>> {
    crate::records::all_under(&*shared.store, &store_ns(tenant, prefix)).await
}

pub(super) async fn store_search(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Typed(search): Typed<ItemSearch>,
) -> ApiResult<Json<Value>> {
    let (limit, offset) = (count_or(search.limit, 10), count_or(search.offset, 0));
    // No embeddings: a query matches items whose value contains it as text.
    let query = search.query.as_deref().map(str::to_lowercase);
    let items: Vec<Value> = items_under(&shared, &tenant, &search.namespace_prefix.0)
        .await?
        .iter()
        .filter(|item| matches(&item.value, search.filter.as_ref()))
        .filter(|item| {
            query
                .as_ref()
                .is_none_or(|q| item.value.to_string().to_lowercase().contains(q))
        })
        .skip(offset)
        .take(limit)
        .map(item_json)
        .collect();
    Ok(Json(json!({"items": items})))
}

pub(super) async fn store_namespaces(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Typed(search): Typed<NamespaceSearch>,
) -> ApiResult<Json<Value>> {
    let suffix = search.suffix.0;
    let max_depth = search.max_depth.map(|depth| depth.0);
    let (limit, offset) = (count_or(search.limit, 100), count_or(search.offset, 0));
    let namespaces: BTreeSet<Vec<String>> = items_under(&shared, &tenant, &search.prefix.0)
        .await?
        .into_iter()
        .map(|item| item.namespace.into_iter().skip(2).collect::<Vec<_>>())
        .filter(|ns| ns.ends_with(&suffix))
        .map(|mut ns| {
            if let Some(depth) = max_depth {
                ns.truncate(depth);
            }
            ns
        })
        .collect();
    let page: Vec<Vec<String>> = namespaces.into_iter().skip(offset).take(limit).collect();
    Ok(Json(json!({"namespaces": page})))
}
