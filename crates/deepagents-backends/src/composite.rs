//! Several backends in one tree, routed by path prefix.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use crate::glob::GlobPattern;
use crate::path::VPath;
use crate::protocol::{
    Backend, BackendContext, BackendError, Changed, FileInfo, FileOpError, GlobResult, GrepQuery,
    GrepResult, PathMapping, RawFile, ReadResult, Sandbox,
};

/// Routes each path to the backend mounted at its longest matching prefix (on segment
/// boundaries: a route at `/mem` does not catch `/memories/x`), or to the default backend.
///
/// The routed backend sees paths with the prefix stripped, and every path it returns gets the
/// prefix back. `ls` of a directory above mount points shows them beside the default's entries;
/// `glob` and `grep` over such a directory search every backend below it, with one global
/// match cap. Files of the default backend that lie under a mount point are hidden by the mount.
/// `execute` always runs on the default backend.
#[derive(Clone)]
pub struct CompositeBackend {
    default: Arc<dyn Backend>,
    /// Longest prefix first.
    routes: Vec<(VPath, Arc<dyn Backend>)>,
}

/// Pattern that lists every file, hidden ones included (see [`GlobPattern`]).
const EVERY_FILE: &str = "**/{.*,*}";

impl CompositeBackend {
    /// A composite with only a default backend.
    pub fn new(default: Arc<dyn Backend>) -> Self {
        Self {
            default,
            routes: Vec::new(),
        }
    }

    /// Mounts `backend` at `prefix` (e.g. `/memories/`). Fails on an invalid prefix or `/`.
    pub fn route(mut self, prefix: &str, backend: Arc<dyn Backend>) -> Result<Self, BackendError> {
        let prefix = VPath::parse(prefix)?;
        if prefix.is_root() {
            return Err(BackendError::InvalidQuery {
                what: "route",
                message: "a route cannot be mounted at `/`; make that backend the default"
                    .to_owned(),
            });
        }
        self.routes.retain(|(existing, _)| *existing != prefix);
        self.routes.push((prefix, backend));
        self.routes
            .sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.as_str().len()));
        Ok(self)
    }

    /// The mount points, longest first.
    pub fn mounts(&self) -> impl Iterator<Item = &VPath> {
        self.routes.iter().map(|(prefix, _)| prefix)
    }

    /// The backend for `path`, the path it sees, and the context to call it with.
    fn resolve(
        &self,
        cx: &BackendContext,
        path: &VPath,
    ) -> (&dyn Backend, VPath, Option<VPath>, BackendContext) {
        for (prefix, backend) in &self.routes {
            if let Some(inner) = path.strip_prefix(prefix) {
                let mut routed = cx.clone();
                routed.mount = Some(cx.full_path(prefix));
                return (backend.as_ref(), inner, Some(prefix.clone()), routed);
            }
        }
        (self.default.as_ref(), path.clone(), None, cx.clone())
    }

    /// Whether `path` belongs to some route (so the default's file there is hidden).
    fn is_routed(&self, path: &str) -> bool {
        VPath::parse(path).is_ok_and(|path| self.routes.iter().any(|(p, _)| path.starts_with(p)))
    }

    /// Routes mounted strictly below `dir`, with their paths relative to it.
    fn routes_below<'a>(
        &'a self,
        dir: &'a VPath,
    ) -> impl Iterator<Item = &'a (VPath, Arc<dyn Backend>)> {
        self.routes
            .iter()
            .filter(move |(prefix, _)| prefix.starts_with(dir) && prefix != dir)
    }
}

fn restore(prefix: &Option<VPath>, path: &str) -> String {
    match (prefix, VPath::parse(path)) {
        (Some(prefix), Ok(path)) => path.under(prefix).to_string(),
        _ => path.to_owned(),
    }
}

fn routed_cx(cx: &BackendContext, prefix: &VPath) -> BackendContext {
    let mut routed = cx.clone();
    routed.mount = Some(cx.full_path(prefix));
    routed
}

#[async_trait]
impl Backend for CompositeBackend {
    fn name(&self) -> &'static str {
        "composite"
    }

    async fn ls(&self, cx: &BackendContext, path: &VPath) -> Result<Vec<FileInfo>, BackendError> {
        let (backend, inner, prefix, routed) = self.resolve(cx, path);
        if prefix.is_some() {
            let mut entries = backend.ls(&routed, &inner).await?;
            for entry in &mut entries {
                entry.path = restore(&prefix, &entry.path);
            }
            return Ok(entries);
        }
        let mut entries: BTreeMap<String, FileInfo> = BTreeMap::new();
        let mounts_here: Vec<String> = self
            .routes_below(path)
            .filter_map(|(mount, _)| {
                let child = mount.relative_to(path)?.split('/').next()?;
                path.join(child).ok().map(|p| p.to_string())
            })
            .collect();
        match self.default.ls(cx, path).await {
            Ok(found) => {
                for entry in found {
                    if !self.is_routed(&entry.path) {
                        entries.insert(entry.path.clone(), entry);
                    }
                }
            }
            Err(BackendError::NotFound { .. }) if !mounts_here.is_empty() => {}
            Err(error) => return Err(error),
        }
        for mount in mounts_here {
            entries.insert(
                mount.clone(),
                FileInfo {
                    path: mount,
                    is_dir: true,
                    size: 0,
                    modified_at_ms: None,
                },
            );
        }
        Ok(entries.into_values().collect())
    }

    async fn read(
        &self,
        cx: &BackendContext,
        path: &VPath,
        offset: usize,
        limit: usize,
    ) -> Result<ReadResult, BackendError> {
        let (backend, inner, _, routed) = self.resolve(cx, path);
        backend.read(&routed, &inner, offset, limit).await
    }

    async fn read_raw(&self, cx: &BackendContext, path: &VPath) -> Result<RawFile, BackendError> {
        let (backend, inner, _, routed) = self.resolve(cx, path);
        backend.read_raw(&routed, &inner).await
    }

    async fn write(
        &self,
        cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        let (backend, inner, _, routed) = self.resolve(cx, path);
        backend.write(&routed, &inner, content).await
    }

    async fn edit(
        &self,
        cx: &BackendContext,
        path: &VPath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<Changed<usize>, BackendError> {
        let (backend, inner, _, routed) = self.resolve(cx, path);
        backend.edit(&routed, &inner, old, new, replace_all).await
    }

    async fn delete(
        &self,
        cx: &BackendContext,
        path: &VPath,
    ) -> Result<Changed<usize>, BackendError> {
        if let Some((mount, _)) = self.routes_below(path).next() {
            return Err(BackendError::PermissionDenied {
                path: path.to_string(),
                reason: format!(
                    "it contains the mount point {mount}; delete the entries inside it explicitly"
                ),
            });
        }
        let (backend, inner, prefix, routed) = self.resolve(cx, path);
        if prefix.as_ref() == Some(path) {
            return Err(BackendError::PermissionDenied {
                path: path.to_string(),
                reason: "it is a mount point; delete the entries inside it".to_owned(),
            });
        }
        backend.delete(&routed, &inner).await
    }

    async fn glob(
        &self,
        cx: &BackendContext,
        pattern: &str,
        base: &VPath,
    ) -> Result<GlobResult, BackendError> {
        let (backend, inner, prefix, routed) = self.resolve(cx, base);
        if prefix.is_some() {
            let mut result = backend.glob(&routed, pattern, &inner).await?;
            for file in &mut result.files {
                file.path = restore(&prefix, &file.path);
            }
            return Ok(result);
        }
        let mut result = match self.default.glob(cx, pattern, base).await {
            Ok(result) => result,
            Err(BackendError::NotFound { .. }) if self.routes_below(base).next().is_some() => {
                GlobResult::default()
            }
            Err(error) => return Err(error),
        };
        result.files.retain(|file| !self.is_routed(&file.path));
        // Patterns are relative to `base`, which lies above the mount: list each mounted
        // backend whole and match in the composite's own coordinates.
        let matcher = GlobPattern::new(pattern)?;
        for (mount, routed_backend) in self.routes_below(base) {
            let listed = routed_backend
                .glob(&routed_cx(cx, mount), EVERY_FILE, &VPath::root())
                .await?;
            result.truncated |= listed.truncated;
            let mount = Some(mount.clone());
            for mut file in listed.files {
                file.path = restore(&mount, &file.path);
                let keep = VPath::parse(&file.path).is_ok_and(|path| {
                    self.resolve(cx, &path).2 == mount
                        && path.relative_to(base).is_some_and(|r| matcher.matches(r))
                });
                if keep {
                    result.files.push(file);
                }
            }
        }
        result.files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(result)
    }

    async fn grep(
        &self,
        cx: &BackendContext,
        query: &GrepQuery,
    ) -> Result<GrepResult, BackendError> {
        let (backend, inner, prefix, routed) = self.resolve(cx, &query.path);
        if prefix.is_some() {
            let routed_query = GrepQuery {
                path: inner,
                ..query.clone()
            };
            let mut result = backend.grep(&routed, &routed_query).await?;
            for found in &mut result.matches {
                found.path = restore(&prefix, &found.path);
            }
            return Ok(result);
        }
        let mut result = match self.default.grep(cx, query).await {
            Ok(result) => result,
            Err(BackendError::NotFound { .. })
                if self.routes_below(&query.path).next().is_some() =>
            {
                GrepResult::default()
            }
            Err(error) => return Err(error),
        };
        result.matches.retain(|found| !self.is_routed(&found.path));
        let include = query.include.as_deref().map(GlobPattern::new).transpose()?;
        for (mount, routed_backend) in self.routes_below(&query.path) {
            let routed_query = GrepQuery {
                path: VPath::root(),
                include: None,
                ..query.clone()
            };
            let found = routed_backend
                .grep(&routed_cx(cx, mount), &routed_query)
                .await?;
            result.truncated |= found.truncated;
            let mount = Some(mount.clone());
            for mut hit in found.matches {
                hit.path = restore(&mount, &hit.path);
                let keep = VPath::parse(&hit.path).is_ok_and(|path| {
                    self.resolve(cx, &path).2 == mount
                        && include.as_ref().is_none_or(|include| {
                            path.relative_to(&query.path)
                                .is_some_and(|r| include.matches(r))
                        })
                });
                if keep {
                    result.matches.push(hit);
                }
            }
        }
        result.matches.sort_by(|a, b| {
            (a.path.as_str(), a.line_number).cmp(&(b.path.as_str(), b.line_number))
        });
        if result.matches.len() > query.max_count {
            result.matches.truncate(query.max_count);
            result.truncated = true;
        }
        Ok(result)
    }

    async fn upload_files(
        &self,
        cx: &BackendContext,
        files: Vec<(String, Vec<u8>)>,
    ) -> Changed<Vec<Result<(), FileOpError>>> {
        let mut answers: Vec<Option<Result<(), FileOpError>>> = vec![None; files.len()];
        // Group by route (None = default), remembering input positions.
        let mut groups: BTreeMap<Option<VPath>, Vec<(usize, String, Vec<u8>)>> = BTreeMap::new();
        for (index, (raw, bytes)) in files.into_iter().enumerate() {
            match VPath::parse(&raw) {
                Err(_) => answers[index] = Some(Err(FileOpError::InvalidPath)),
                Ok(path) => {
                    let (_, inner, prefix, _) = self.resolve(cx, &path);
                    groups
                        .entry(prefix)
                        .or_default()
                        .push((index, inner.to_string(), bytes));
                }
            }
        }
        let mut update = deepagents_core::StateUpdate::default();
        for (prefix, items) in groups {
            let (backend, routed) = match &prefix {
                Some(mount) => (self.resolve(cx, mount).0, routed_cx(cx, mount)),
                None => (self.default.as_ref(), cx.clone()),
            };
            let (indices, batch): (Vec<usize>, Vec<(String, Vec<u8>)>) =
                items.into_iter().map(|(i, p, b)| (i, (p, b))).unzip();
            let done = backend.upload_files(&routed, batch).await;
            update.files.extend(done.update.files);
            for (index, answer) in indices.into_iter().zip(done.value) {
                answers[index] = Some(answer);
            }
        }
        Changed {
            value: answers
                .into_iter()
                .map(|a| a.unwrap_or(Err(FileOpError::InvalidPath)))
                .collect(),
            update,
        }
    }

    async fn download_files(
        &self,
        cx: &BackendContext,
        paths: Vec<String>,
    ) -> Vec<Result<Vec<u8>, FileOpError>> {
        let mut answers = Vec::with_capacity(paths.len());
        for raw in paths {
            let answer = match VPath::parse(&raw) {
                Err(_) => Err(FileOpError::InvalidPath),
                Ok(path) => {
                    let (backend, inner, _, routed) = self.resolve(cx, &path);
                    backend
                        .download_files(&routed, vec![inner.to_string()])
                        .await
                        .pop()
                        .unwrap_or(Err(FileOpError::FileNotFound))
                }
            };
            answers.push(answer);
        }
        answers
    }

    fn as_sandbox(&self) -> Option<&dyn Sandbox> {
        self.default.as_sandbox()
    }

    fn path_mappings(&self) -> Vec<PathMapping> {
        let mut mappings = self.default.path_mappings();
        for (prefix, backend) in self.routes.iter().rev() {
            mappings.extend(backend.path_mappings().into_iter().map(|m| PathMapping {
                prefix: m.prefix.under(prefix),
                host: m.host,
            }));
        }
        mappings
    }
}
