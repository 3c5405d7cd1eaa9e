//! Files kept in the agent state.

use std::collections::BTreeMap;

use async_trait::async_trait;
use deepagents_core::{FileContent, FileData, StateUpdate};

use crate::memory::{MemoryTree, file_data, now_ms};
use crate::path::VPath;
use crate::protocol::{
    Backend, BackendContext, BackendError, Changed, FileInfo, FileOpError, GlobResult, GrepQuery,
    GrepResult, RawFile, ReadResult,
};

/// Files in the agent state: scratch space per thread, checkpointed with the run and shared by
/// an agent and its subagents.
///
/// Files are keyed in [`AgentState::files`](deepagents_core::AgentState::files) by the full
/// virtual path the agent sees (mount point included). Writes do not change the state directly:
/// they return a [`StateUpdate`] that the tool hands back and the run merges after the step, so
/// calls in the same step all read the state as it was when the step began.
#[derive(Clone, Copy, Debug, Default)]
pub struct StateBackend;

impl StateBackend {
    /// The files visible through this backend, keyed by backend-relative path.
    fn tree(cx: &BackendContext) -> MemoryTree<&FileData> {
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
        MemoryTree::new(files)
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
        Self::tree(cx).ls(path)
    }

    async fn read(
        &self,
        cx: &BackendContext,
        path: &VPath,
        offset: usize,
        limit: usize,
    ) -> Result<ReadResult, BackendError> {
        Self::tree(cx).read(path, offset, limit)
    }

    async fn read_raw(&self, cx: &BackendContext, path: &VPath) -> Result<RawFile, BackendError> {
        Self::tree(cx).read_raw(path)
    }

    async fn write(
        &self,
        cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        Self::tree(cx).check_writable(path)?;
        let mut update = StateUpdate::default();
        let file = FileData {
            content: FileContent::Text {
                text: content.to_owned(),
            },
            modified_at_ms: now_ms(),
        };
        Self::put(cx, &mut update, path, file);
        Ok(Changed { value: (), update })
    }

    async fn edit(
        &self,
        cx: &BackendContext,
        path: &VPath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<Changed<usize>, BackendError> {
        let tree = Self::tree(cx);
        let FileContent::Text { text } = &tree.existing(path)?.content else {
            let mime_type = tree.read_raw(path)?.mime_type;
            return Err(BackendError::Binary {
                path: path.to_string(),
                mime_type,
            });
        };
        let (text, count) = crate::text::replace(path.as_str(), text, old, new, replace_all)?;
        let mut update = StateUpdate::default();
        let file = FileData {
            content: FileContent::Text { text },
            modified_at_ms: now_ms(),
        };
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
        let doomed = Self::tree(cx).delete_set(path)?;
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
        Self::tree(cx).glob(pattern, base)
    }

    async fn grep(
        &self,
        cx: &BackendContext,
        query: &GrepQuery,
    ) -> Result<GrepResult, BackendError> {
        Self::tree(cx).grep(query)
    }

    async fn upload_files(
        &self,
        cx: &BackendContext,
        files: Vec<(String, Vec<u8>)>,
    ) -> Changed<Vec<Result<(), FileOpError>>> {
        let tree = Self::tree(cx);
        let mut update = StateUpdate::default();
        let answers = files
            .into_iter()
            .map(|(raw, bytes)| {
                let path = VPath::parse(&raw).map_err(|_| FileOpError::InvalidPath)?;
                tree.check_writable(&path).map_err(|e| e.file_op_code())?;
                let file = file_data(&path, bytes, now_ms());
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
        let tree = Self::tree(cx);
        tree.download_files(paths)
    }
}
