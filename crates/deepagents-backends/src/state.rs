//! Files kept in the agent state.

use std::collections::BTreeMap;

use async_trait::async_trait;
use deepagents_core::{FileContent, FileData, StateUpdate};

use crate::memory::{MemoryTree, file_data, now_ms};
use crate::path::VPath;
use crate::protocol::{
    Backend, BackendContext, BackendError, Changed, DEFAULT_MAX_FILE_SIZE, FileInfo, FileOpError,
    GlobResult, GrepQuery, GrepResult, RawFile, ReadResult,
};

/// Files in the agent state: scratch space per thread, checkpointed with the run and shared by
/// an agent and its subagents.
///
/// Files are keyed in [`AgentState::files`](deepagents_core::AgentState::files) by the full
/// virtual path the agent sees (mount point included). Writes do not change the state directly:
/// they return a [`StateUpdate`] that the tool hands back and the run merges after the step
/// (the harness shows each mutating call the updates of the mutating calls before it).
///
/// Files over the size limit ([`DEFAULT_MAX_FILE_SIZE`] unless set with
/// [`StateBackend::with_max_file_size`]) are neither written nor loaded whole, as on disk (a
/// text file is still read page by page). Text that is not UTF-8 (uploaded bytes) is kept as
/// bytes and edited byte-wise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateBackend {
    max_file_size: u64,
}

impl Default for StateBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl StateBackend {
    /// A state backend with the default options.
    pub const fn new() -> Self {
        Self {
            max_file_size: DEFAULT_MAX_FILE_SIZE,
        }
    }

    /// The largest file read, written, edited, uploaded or downloaded, in bytes (default
    /// [`DEFAULT_MAX_FILE_SIZE`]).
    pub const fn with_max_file_size(mut self, bytes: u64) -> Self {
        self.max_file_size = bytes;
        self
    }

    /// The files visible through this backend, keyed by backend-relative path.
    fn tree<'a>(&self, cx: &'a BackendContext) -> MemoryTree<&'a FileData> {
        let mount = cx.mount.clone().unwrap_or_else(VPath::root);
        let files = cx
            .state
            .files
            .iter()
            .filter_map(|(key, file)| {
                let full = VPath::parse(key).ok()?;
                Some((full.strip_prefix(&mount)?, file))
            })
            .collect();
        MemoryTree::new(files).with_max_file_size(self.max_file_size)
    }

    /// The update that puts `content` at `path`, in place of `previous` (whose creation time
    /// it keeps).
    fn text_file(
        cx: &BackendContext,
        previous: Option<&FileData>,
        path: &VPath,
        content: &str,
    ) -> Changed<()> {
        let mut update = StateUpdate::default();
        let now = now_ms();
        let file = FileData {
            content: FileContent::Text {
                text: content.to_owned(),
            },
            modified_at_ms: now,
            created_at_ms: now,
        }
        .replacing(previous);
        Self::put(cx, &mut update, path, file);
        Changed { value: (), update }
    }

    fn put(cx: &BackendContext, update: &mut StateUpdate, path: &VPath, file: FileData) {
        update
            .files
            .insert(cx.full_path(path).to_string(), Some(file));
    }
}

#[async_trait]
impl Backend for StateBackend {
    fn name(&self) -> &'static str {
        "state"
    }

    async fn ls(&self, cx: &BackendContext, path: &VPath) -> Result<Vec<FileInfo>, BackendError> {
        self.tree(cx).ls(path)
    }

    async fn read(
        &self,
        cx: &BackendContext,
        path: &VPath,
        offset: usize,
        limit: usize,
    ) -> Result<ReadResult, BackendError> {
        self.tree(cx).read(path, offset, limit)
    }

    async fn read_raw(&self, cx: &BackendContext, path: &VPath) -> Result<RawFile, BackendError> {
        self.tree(cx).read_raw(path)
    }

    async fn write(
        &self,
        cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        self.tree(cx).check_create(path, content.len())?;
        Ok(Self::text_file(cx, None, path, content))
    }

    async fn overwrite(
        &self,
        cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        let tree = self.tree(cx);
        tree.check_write(path, content.len())?;
        Ok(Self::text_file(cx, tree.file(path), path, content))
    }

    async fn edit(
        &self,
        cx: &BackendContext,
        path: &VPath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<Changed<usize>, BackendError> {
        // Text that is not UTF-8 stays bytes, with every byte the edit does not replace kept.
        let tree = self.tree(cx);
        let (content, count) = tree.edit_content(path, old, new, replace_all)?;
        let mut update = StateUpdate::default();
        let now = now_ms();
        let file = FileData {
            content,
            modified_at_ms: now,
            created_at_ms: now,
        }
        .replacing(tree.file(path));
        Self::put(cx, &mut update, path, file);
        Ok(Changed {
            value: count,
            update,
        })
    }

    async fn delete(
        &self,
        cx: &BackendContext,
        path: &VPath,
    ) -> Result<Changed<usize>, BackendError> {
        let doomed = self.tree(cx).delete_set(path)?;
        let files: BTreeMap<String, Option<FileData>> = doomed
            .iter()
            .map(|p| (cx.full_path(p).to_string(), None))
            .collect();
        Ok(Changed {
            value: doomed.len(),
            update: StateUpdate {
                files,
                ..StateUpdate::default()
            },
        })
    }

    async fn glob(
        &self,
        cx: &BackendContext,
        pattern: &str,
        base: &VPath,
    ) -> Result<GlobResult, BackendError> {
        self.tree(cx).glob(pattern, base)
    }

    async fn grep(
        &self,
        cx: &BackendContext,
        query: &GrepQuery,
    ) -> Result<GrepResult, BackendError> {
        self.tree(cx).grep(query)
    }

    async fn upload_files(
        &self,
        cx: &BackendContext,
        files: Vec<(String, Vec<u8>)>,
    ) -> Changed<Vec<Result<(), FileOpError>>> {
        let tree = self.tree(cx);
        let mut update = StateUpdate::default();
        let answers = files
            .into_iter()
            .map(|(raw, bytes)| {
                let path = VPath::parse(&raw).map_err(|_| FileOpError::InvalidPath)?;
                tree.check_write(&path, bytes.len())
                    .map_err(|e| e.file_op_code())?;
                let file = file_data(&path, bytes, now_ms()).replacing(tree.file(&path));
                Self::put(cx, &mut update, &path, file);
                Ok(())
            })
            .collect();
        Changed {
            value: answers,
            update,
        }
    }

    async fn download_files(
        &self,
        cx: &BackendContext,
        paths: Vec<String>,
    ) -> Vec<Result<Vec<u8>, FileOpError>> {
        let tree = self.tree(cx);
        tree.download_files(paths)
    }
}
