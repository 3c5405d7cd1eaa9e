//! Files kept in a [`Store`], shared across threads.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use deepagents_core::{FileContent, FileData};

use super::{SearchQuery, Store, StoreError};
use crate::memory::{MemoryTree, file_data, now_ms};
use crate::path::VPath;
use crate::protocol::{
    Backend, BackendContext, BackendError, Changed, DEFAULT_MAX_FILE_SIZE, FileInfo, FileOpError,
    GlobResult, GrepQuery, GrepResult, RawFile, ReadResult,
};

/// Computes the namespace of a call from its context (user, assistant, thread…).
pub type NamespaceFn = Arc<dyn Fn(&BackendContext) -> Vec<String> + Send + Sync>;

/// Files as items of a [`Store`]: one item per file, keyed by its backend-relative path, in a
/// namespace computed per call. Mount it under a prefix such as `/memories/` in a
/// [`CompositeBackend`](crate::CompositeBackend) for long-term memory that outlives threads.
///
/// Files over the size limit ([`DEFAULT_MAX_FILE_SIZE`] unless set with
/// [`StoreBackend::with_max_file_size`]) are not written; text over it is read page by page.
#[derive(Clone)]
pub struct StoreBackend {
    store: Arc<dyn Store>,
    namespace: NamespaceFn,
    max_file_size: u64,
}

impl fmt::Debug for StoreBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreBackend")
            .field("max_file_size", &self.max_file_size)
            .finish_non_exhaustive()
    }
}

/// Items fetched per search page when loading a whole namespace.
const PAGE: usize = 500;

fn io<'a>(operation: &'static str, path: &'a str) -> impl Fn(StoreError) -> BackendError + 'a {
    move |error| BackendError::Io {
        operation,
        path: path.to_owned(),
        message: error.to_string(),
    }
}

impl StoreBackend {
    /// Files in `store` under the one namespace `["filesystem"]`, shared by every thread,
    /// assistant and user. For anything multi-user, give a factory
    /// ([`with_namespace`](Self::with_namespace)): each call's context carries the thread id,
    /// the assistant id and the runtime data to key on. (The reference system's legacy default
    /// keys on the assistant id; a fixed default is chosen here so that data never moves when
    /// an agent is renamed, and the factory is one line:
    /// `.with_namespace(|cx| vec![cx.assistant_id.clone().unwrap_or_else(|| "default".into())])`.)
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            namespace: Arc::new(|_| vec!["filesystem".to_owned()]),
            max_file_size: DEFAULT_MAX_FILE_SIZE,
        }
    }

    /// The largest file read, written, edited, uploaded or downloaded, in bytes (default
    /// [`DEFAULT_MAX_FILE_SIZE`]).
    pub fn with_max_file_size(mut self, bytes: u64) -> Self {
        self.max_file_size = bytes;
        self
    }

    /// Chooses the namespace per call, e.g. per user from the runtime context. Components must
    /// be non-empty and use only letters, digits and `- _ . @ + : ~`.
    pub fn with_namespace(
        mut self,
        namespace: impl Fn(&BackendContext) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        self.namespace = Arc::new(namespace);
        self
    }

    fn namespace(&self, cx: &BackendContext) -> Result<Vec<String>, BackendError> {
        let namespace = (self.namespace)(cx);
        super::validate_namespace(&namespace).map_err(|e| BackendError::PermissionDenied {
            path: "/".to_owned(),
            reason: e.to_string(),
        })?;
        Ok(namespace)
    }

    /// Every file of the namespace.
    async fn tree(&self, cx: &BackendContext) -> Result<MemoryTree<FileData>, BackendError> {
        let namespace = self.namespace(cx)?;
        let mut files = BTreeMap::new();
        let mut query = SearchQuery {
            limit: PAGE,
            ..SearchQuery::default()
        };
        loop {
            let page = self
                .store
                .search(&namespace, &query)
                .await
                .map_err(io("list", "/"))?;
            let done = page.len() < PAGE;
            for item in page.into_iter().filter(|item| item.namespace == namespace) {
                // Items that are not files (written by other tools) are not part of the tree.
                if let (Ok(path), Ok(file)) = (
                    VPath::parse(&item.key),
                    serde_json::from_value::<FileData>(item.value),
                ) {
                    files.insert(path, file);
                }
            }
            if done {
                return Ok(MemoryTree::new(files).with_max_file_size(self.max_file_size));
            }
            query.offset += PAGE;
        }
    }

    /// Puts `content` at `path` in place of `previous` (whose creation time it keeps).
    async fn put_text(
        &self,
        cx: &BackendContext,
        previous: Option<&FileData>,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        let now = now_ms();
        let file = FileData {
            content: FileContent::Text {
                text: content.to_owned(),
            },
            modified_at_ms: now,
            created_at_ms: now,
        }
        .replacing(previous);
        self.put(cx, path, &file).await?;
        Ok(Changed::outside_state(()))
    }

    async fn put(
        &self,
        cx: &BackendContext,
        path: &VPath,
        file: &FileData,
    ) -> Result<(), BackendError> {
        let namespace = self.namespace(cx)?;
        let value = serde_json::to_value(file).map_err(|e| BackendError::Io {
            operation: "write",
            path: path.to_string(),
            message: e.to_string(),
        })?;
        self.store
            .put(&namespace, path.as_str(), value)
            .await
            .map_err(io("write", path.as_str()))
    }
}

#[async_trait]
impl Backend for StoreBackend {
    fn name(&self) -> &'static str {
        "store"
    }

    async fn ls(&self, cx: &BackendContext, path: &VPath) -> Result<Vec<FileInfo>, BackendError> {
        self.tree(cx).await?.ls(path)
    }

    async fn read(
        &self,
        cx: &BackendContext,
        path: &VPath,
        offset: usize,
        limit: usize,
    ) -> Result<ReadResult, BackendError> {
        self.tree(cx).await?.read(path, offset, limit)
    }

    async fn read_raw(&self, cx: &BackendContext, path: &VPath) -> Result<RawFile, BackendError> {
        self.tree(cx).await?.read_raw(path)
    }

    async fn write(
        &self,
        cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        // Checked, then put: a store has no put-if-absent, so two writers racing to create one
        // file may both succeed (the later one kept), as two edits may.
        let tree = self.tree(cx).await?;
        tree.check_create(path, content.len())?;
        self.put_text(cx, None, path, content).await
    }

    async fn overwrite(
        &self,
        cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        let tree = self.tree(cx).await?;
        tree.check_write(path, content.len())?;
        self.put_text(cx, tree.file(path), path, content).await
    }

    async fn edit(
        &self,
        cx: &BackendContext,
        path: &VPath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<Changed<usize>, BackendError> {
        // Non-UTF-8 text keeps every byte the edit does not replace.
        let tree = self.tree(cx).await?;
        let (content, count) = tree.edit_content(path, old, new, replace_all)?;
        let now = now_ms();
        let file = FileData {
            content,
            modified_at_ms: now,
            created_at_ms: now,
        }
        .replacing(tree.file(path));
        self.put(cx, path, &file).await?;
        Ok(Changed::outside_state(count))
    }

    async fn delete(
        &self,
        cx: &BackendContext,
        path: &VPath,
    ) -> Result<Changed<usize>, BackendError> {
        let namespace = self.namespace(cx)?;
        let doomed = self.tree(cx).await?.delete_set(path)?;
        for file in &doomed {
            self.store
                .delete(&namespace, file.as_str())
                .await
                .map_err(io("delete", file.as_str()))?;
        }
        Ok(Changed::outside_state(doomed.len()))
    }

    async fn glob(
        &self,
        cx: &BackendContext,
        pattern: &str,
        base: &VPath,
    ) -> Result<GlobResult, BackendError> {
        self.tree(cx).await?.glob(pattern, base)
    }

    async fn grep(
        &self,
        cx: &BackendContext,
        query: &GrepQuery,
    ) -> Result<GrepResult, BackendError> {
        self.tree(cx).await?.grep(query)
    }

    async fn upload_files(
        &self,
        cx: &BackendContext,
        files: Vec<(String, Vec<u8>)>,
    ) -> Changed<Vec<Result<(), FileOpError>>> {
        let tree = match self.tree(cx).await {
            Ok(tree) => tree,
            Err(error) => {
                return Changed::outside_state(vec![Err(error.file_op_code()); files.len()]);
            }
        };
        let mut answers = Vec::with_capacity(files.len());
        for (raw, bytes) in files {
            let answer = match VPath::parse(&raw) {
                Err(_) => Err(FileOpError::InvalidPath),
                Ok(path) => match tree.check_write(&path, bytes.len()) {
                    Err(error) => Err(error.file_op_code()),
                    Ok(()) => self
                        .put(
                            cx,
                            &path,
                            &file_data(&path, bytes, now_ms()).replacing(tree.file(&path)),
                        )
                        .await
                        .map_err(|e| e.file_op_code()),
                },
            };
            answers.push(answer);
        }
        Changed::outside_state(answers)
    }

    async fn download_files(
        &self,
        cx: &BackendContext,
        paths: Vec<String>,
    ) -> Vec<Result<Vec<u8>, FileOpError>> {
        let tree = match self.tree(cx).await {
            Ok(tree) => tree,
            Err(error) => return vec![Err(error.file_op_code()); paths.len()],
        };
        tree.download_files(paths)
    }
}
