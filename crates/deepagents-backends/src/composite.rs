//! Several backends in one tree, routed by path prefix.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use crate::filtered::grep_kept;
use crate::glob::GlobPattern;
use crate::path::VPath;
use crate::protocol::{
    Backend, BackendContext, BackendError, Changed, FileInfo, FileOpError, GlobResult, GrepMatch,
    GrepQuery, GrepResult, PathMapping, RawFile, ReadResult, Sandbox,
};

/// Routes each path to the backend mounted at its longest matching prefix (on segment
/// boundaries: a route at `/mem` does not catch `/memories/x`), or to the default backend.
///
/// The routed backend sees paths with the prefix stripped, and every path it returns gets the
/// prefix back, in results and in errors alike. `ls` of a directory above mount points shows them beside the default's entries;
/// `glob` and `grep` over such a directory search every backend below it, with one global
/// match cap. Files of the default backend that lie under a mount point are hidden by the mount.
/// `execute` always runs on the default backend.
#[derive(Clone)]
pub struct CompositeBackend {
    default: Arc<dyn Backend>,
    /// Longest prefix first.
    routes: Vec<(VPath, Arc<dyn Backend>)>,
    /// Mount points listed only while their backend holds something.
    quiet: Vec<VPath>,
}

/// Pattern that lists every file, hidden ones included (see [`GlobPattern`]).
const EVERY_FILE: &str = "**/{.*,*}";

impl CompositeBackend {
    /// A composite with only a default backend.
    pub fn new(default: Arc<dyn Backend>) -> Self {
        Self {
            default,
            routes: Vec::new(),
            quiet: Vec::new(),
        }
    }

    /// Like [`route`](Self::route), but `ls` shows the mount point only while `backend` holds
    /// something: for directories the harness fills on demand, which would be clutter empty.
    pub fn route_quiet(
        self,
        prefix: &str,
        backend: Arc<dyn Backend>,
    ) -> Result<Self, BackendError> {
        let mut routed = self.route(prefix, backend)?;
        routed.quiet.push(VPath::parse(prefix)?);
        Ok(routed)
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
        self.quiet.retain(|existing| *existing != prefix);
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

    /// The mount point whose backend holds `path`, `None` for the default.
    fn mount_of(&self, path: &VPath) -> Option<&VPath> {
        self.routes
            .iter()
            .map(|(prefix, _)| prefix)
            .find(|prefix| path.starts_with(prefix))
    }

    /// Whether `path` belongs to some route (so the default's file there is hidden).
    fn is_routed(&self, path: &str) -> bool {
        VPath::parse(path).is_ok_and(|path| self.mount_of(&path).is_some())
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

/// Puts the mount prefix back into the paths an error of a routed call names.
fn restore_error(prefix: &Option<VPath>) -> impl Fn(BackendError) -> BackendError + '_ {
    move |error| error.map_paths(|path| restore(prefix, path))
}

/// How a route mounted below a grep's search path is to be searched for its include glob.
#[derive(Debug, PartialEq, Eq)]
enum RouteInclude {
    /// No file of the route can match.
    Skip,
    /// Search with this include (relative to the route's root); the composite still checks
    /// every match against the original glob, so it may admit more than the glob does.
    Search(Option<String>),
}

/// Translates `include`, relative to the search path, for a route mounted at `mount` relative
/// to that path (e.g. `img` or `a/b`), following the semantics of [`crate::glob`].
fn route_include(include: Option<&str>, mount: &str) -> RouteInclude {
    let Some(pattern) = include else {
        return RouteInclude::Search(None);
    };
    let anchored = pattern.trim_start_matches('/');
    if !pattern.starts_with('/') && !anchored.contains('/') {
        // A name pattern matches at any depth, below the mount as above it.
        return RouteInclude::Search(Some(pattern.to_owned()));
    }
    let mut segments = anchored.split('/');
    for mount_segment in mount.split('/') {
        match segments.next() {
            Some(segment) if is_literal(segment) && segment != mount_segment => {
                return RouteInclude::Skip;
            }
            // A hidden segment lets the whole glob match hidden files; the rest alone would not.
            Some(segment) if is_literal(segment) && !segment.starts_with('.') => {}
            _ => return RouteInclude::Search(None),
        }
    }
    let rest: Vec<&str> = segments.collect();
    if rest.iter().all(|segment| segment.is_empty()) {
        // The glob names the mount point itself (`img` or `img/`), which is a directory.
        return RouteInclude::Skip;
    }
    // The leading `/` keeps the rest anchored at the route's root.
    RouteInclude::Search(Some(format!("/{}", rest.join("/"))))
}

/// Whether a glob segment matches only itself.
fn is_literal(segment: &str) -> bool {
    !segment.contains(['*', '?', '[', ']', '{', '}', '\\'])
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
            let mut entries = backend
                .ls(&routed, &inner)
                .await
                .map_err(restore_error(&prefix))?;
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
            if let Some((quiet, backend)) = self
                .routes
                .iter()
                .find(|(prefix, _)| prefix.as_str() == mount && self.quiet.contains(prefix))
            {
                let empty = backend
                    .ls(&routed_cx(cx, quiet), &VPath::root())
                    .await
                    .map_or(true, |found| found.is_empty());
                if empty {
                    continue;
                }
            }
            entries.insert(
                mount.clone(),
                FileInfo {
                    path: mount,
                    is_dir: true,
                    size: 0,
                    modified_at_ms: None,
                    broken_link: None,
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
        let (backend, inner, prefix, routed) = self.resolve(cx, path);
        backend
            .read(&routed, &inner, offset, limit)
            .await
            .map_err(restore_error(&prefix))
    }

    async fn read_raw(&self, cx: &BackendContext, path: &VPath) -> Result<RawFile, BackendError> {
        let (backend, inner, prefix, routed) = self.resolve(cx, path);
        backend
            .read_raw(&routed, &inner)
            .await
            .map_err(restore_error(&prefix))
    }

    async fn write(
        &self,
        cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        let (backend, inner, prefix, routed) = self.resolve(cx, path);
        backend
            .write(&routed, &inner, content)
            .await
            .map_err(restore_error(&prefix))
    }

    async fn overwrite(
        &self,
        cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        let (backend, inner, prefix, routed) = self.resolve(cx, path);
        backend
            .overwrite(&routed, &inner, content)
            .await
            .map_err(restore_error(&prefix))
    }

    async fn edit(
        &self,
        cx: &BackendContext,
        path: &VPath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<Changed<usize>, BackendError> {
        let (backend, inner, prefix, routed) = self.resolve(cx, path);
        backend
            .edit(&routed, &inner, old, new, replace_all)
            .await
            .map_err(restore_error(&prefix))
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
        backend
            .delete(&routed, &inner)
            .await
            .map_err(restore_error(&prefix))
    }

    async fn glob(
        &self,
        cx: &BackendContext,
        pattern: &str,
        base: &VPath,
    ) -> Result<GlobResult, BackendError> {
        let (backend, inner, prefix, routed) = self.resolve(cx, base);
        if prefix.is_some() {
            let mut result = backend
                .glob(&routed, pattern, &inner)
                .await
                .map_err(restore_error(&prefix))?;
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
        for (mount_path, routed_backend) in self.routes_below(base) {
            let mount = Some(mount_path.clone());
            let listed = routed_backend
                .glob(&routed_cx(cx, mount_path), EVERY_FILE, &VPath::root())
                .await
                .map_err(restore_error(&mount))?;
            result.truncated |= listed.truncated;
            for mut file in listed.files {
                file.path = restore(&mount, &file.path);
                let keep = VPath::parse(&file.path).is_ok_and(|path| {
                    self.mount_of(&path) == Some(mount_path)
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
            // The include glob is relative to the search path, which the route sees stripped
            // but otherwise unchanged: it needs no translation.
            let routed_query = GrepQuery {
                path: inner,
                ..query.clone()
            };
            let mut result = backend
                .grep(&routed, &routed_query)
                .await
                .map_err(restore_error(&prefix))?;
            for found in &mut result.matches {
                found.path = restore(&prefix, &found.path);
            }
            for skipped in &mut result.skipped {
                skipped.path = restore(&prefix, &skipped.path);
            }
            return Ok(result);
        }
        let include = query.include.as_deref().map(GlobPattern::new).transpose()?;
        // Each backend answers with its first `max_count` visible matches in path order; the
        // first `max_count` of their union are then the first of the whole tree.
        let visible_in_default = |found: &GrepMatch| !self.is_routed(&found.path);
        let mut result =
            match grep_kept(self.default.as_ref(), cx, query, &visible_in_default).await {
                Ok(result) => result,
                Err(BackendError::NotFound { .. })
                    if self.routes_below(&query.path).next().is_some() =>
                {
                    GrepResult::default()
                }
                Err(error) => return Err(error),
            };
        result
            .skipped
            .retain(|skipped| !self.is_routed(&skipped.path));
        for (mount_path, routed_backend) in self.routes_below(&query.path) {
            let mount_relative = mount_path.relative_to(&query.path).unwrap_or_default();
            let RouteInclude::Search(routed_include) =
                route_include(query.include.as_deref(), mount_relative)
            else {
                continue;
            };
            let routed_query = GrepQuery {
                path: VPath::root(),
                include: routed_include,
                ..query.clone()
            };
            let mount = Some(mount_path.clone());
            // Deeper mounts hide this route's files below them, and a translated include may
            // admit more than the original glob.
            let visible_path = |routed_path: &str| {
                VPath::parse(&restore(&mount, routed_path)).is_ok_and(|path| {
                    self.mount_of(&path) == Some(mount_path)
                        && include.as_ref().is_none_or(|include| {
                            path.relative_to(&query.path)
                                .is_some_and(|r| include.matches(r))
                        })
                })
            };
            let visible = |found: &GrepMatch| visible_path(&found.path);
            let found = grep_kept(
                routed_backend.as_ref(),
                &routed_cx(cx, mount_path),
                &routed_query,
                &visible,
            )
            .await
            .map_err(restore_error(&mount))?;
            result.truncated |= found.truncated;
            result
                .matches
                .extend(found.matches.into_iter().map(|mut hit| {
                    hit.path = restore(&mount, &hit.path);
                    hit
                }));
            result.skipped.extend(
                found
                    .skipped
                    .into_iter()
                    .filter(|skipped| visible_path(&skipped.path))
                    .map(|mut skipped| {
                        skipped.path = restore(&mount, &skipped.path);
                        skipped
                    }),
            );
        }
        result.matches.sort_by(|a, b| {
            (a.path.as_str(), a.line_number).cmp(&(b.path.as_str(), b.line_number))
        });
        result.skipped.sort_by(|a, b| a.path.cmp(&b.path));
        if result.matches.len() > query.max_count {
            result.matches.truncate(query.max_count);
            result.truncated = true;
        }
        result.trim_skipped(query.max_count);
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
