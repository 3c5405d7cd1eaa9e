//! Read-side operations over a map of whole files, shared by the backends that keep files as
//! values (state and store). Directories are implied by the paths of the files below them.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::ops::Bound;

use deepagents_core::{FileContent, FileData};

use crate::glob::GlobPattern;
use crate::mime;
use crate::path::VPath;
use crate::protocol::{
    BackendError, DEFAULT_MAX_FILE_SIZE, FileInfo, FileOpError, GlobResult, GrepQuery, GrepResult,
    RawFile, ReadResult, SkipReason, SkippedFile,
};
use crate::text::{self, LineMatcher};

/// Files by path; `F` is `FileData` or a reference to one.
#[derive(Debug)]
pub struct MemoryTree<F> {
    files: BTreeMap<VPath, F>,
    max_file_size: u64,
}

/// A file as the agent sees it. Text kept as a string is still binary when its name or content
/// says so (see [`mime`]), and text that is not UTF-8 is kept as bytes, so these backends answer
/// as the disk backend does for the same bytes.
enum View<'a> {
    /// Text, UTF-8 or not.
    Text(&'a [u8]),
    Binary {
        mime_type: &'a str,
        data: &'a [u8],
    },
}

fn view<'a>(path: &VPath, file: &'a FileData) -> View<'a> {
    match &file.content {
        FileContent::Text { text } => match mime::binary_type_of_text(path.as_str(), text) {
            None => View::Text(text.as_bytes()),
            Some(mime_type) => View::Binary {
                mime_type,
                data: text.as_bytes(),
            },
        },
        FileContent::Binary { mime_type, data } => {
            // Text that is not UTF-8 is stored as bytes typed `text/plain`; before such text
            // counted as text it was stored as `application/octet-stream`. Both are text when
            // the bytes say so; any other stored type is the writer's word and stands.
            let untyped = mime::is_text_mime(mime_type) || mime_type == mime::OCTET_STREAM;
            match mime::binary_type(path.as_str(), data) {
                None if untyped => View::Text(data),
                Some(sniffed) if mime::is_text_mime(mime_type) => View::Binary {
                    mime_type: sniffed,
                    data,
                },
                _ => View::Binary { mime_type, data },
            }
        }
    }
}

/// The media type of text held as `bytes`.
fn text_mime(bytes: &[u8]) -> &'static str {
    if std::str::from_utf8(bytes).is_ok() {
        mime::TEXT_MIME
    } else {
        mime::NON_UTF8_TEXT_MIME
    }
}

/// How text that is not UTF-8 is stored: as bytes, typed so [`view`] reads them as text.
fn non_utf8_text(data: Vec<u8>) -> FileContent {
    FileContent::Binary {
        mime_type: mime::NON_UTF8_TEXT_MIME.to_owned(),
        data,
    }
}

fn size_of(file: &FileData) -> u64 {
    match &file.content {
        FileContent::Text { text } => text.len() as u64,
        FileContent::Binary { data, .. } => data.len() as u64,
    }
}

fn info(path: &VPath, file: &FileData) -> FileInfo {
    FileInfo {
        path: path.to_string(),
        is_dir: false,
        size: size_of(file),
        modified_at_ms: Some(file.modified_at_ms),
        broken_link: None,
    }
}

impl<F: Borrow<FileData>> MemoryTree<F> {
    /// A tree over `files` that refuses files over [`DEFAULT_MAX_FILE_SIZE`].
    pub fn new(files: BTreeMap<VPath, F>) -> Self {
        Self {
            files,
            max_file_size: DEFAULT_MAX_FILE_SIZE,
        }
    }

    /// The largest file read, edited, downloaded or written, in bytes.
    pub fn with_max_file_size(mut self, bytes: u64) -> Self {
        self.max_file_size = bytes;
        self
    }

    /// Checks that a file of `size` bytes may be written at `path`: it is within the size limit,
    /// it is not a directory, and no ancestor is a file.
    pub fn check_write(&self, path: &VPath, size: usize) -> Result<(), BackendError> {
        self.check_size_to_write(path, size)?;
        self.check_writable(path)
    }

    /// [`check_write`](Self::check_write) for a create-only write: also refuses a file that
    /// already exists at `path` ([`BackendError::AlreadyExists`]).
    pub fn check_create(&self, path: &VPath, size: usize) -> Result<(), BackendError> {
        self.check_write(path, size)?;
        if self.file(path).is_some() {
            return Err(BackendError::AlreadyExists {
                path: path.to_string(),
            });
        }
        Ok(())
    }

    fn check_size_to_write(&self, path: &VPath, size: usize) -> Result<(), BackendError> {
        let size = u64::try_from(size).unwrap_or(u64::MAX);
        if size > self.max_file_size {
            return Err(BackendError::TooLargeToWrite {
                path: path.to_string(),
                size,
                max: self.max_file_size,
            });
        }
        Ok(())
    }

    /// The file at `path` if it is within the size limit.
    fn within_limit(&self, path: &VPath) -> Result<&FileData, BackendError> {
        let file = self.existing(path)?;
        self.check_limit(path, file)?;
        Ok(file)
    }

    /// Refuses to load `file` whole when it is over the size limit.
    fn check_limit(&self, path: &VPath, file: &FileData) -> Result<(), BackendError> {
        let size = size_of(file);
        if size > self.max_file_size {
            return Err(BackendError::TooLarge {
                path: path.to_string(),
                size,
                max: self.max_file_size,
            });
        }
        Ok(())
    }

    /// The file at `path`, if it is one.
    pub fn file(&self, path: &VPath) -> Option<&FileData> {
        self.files.get(path).map(Borrow::borrow)
    }

    /// Whether files exist strictly below `path`.
    pub fn is_dir(&self, path: &VPath) -> bool {
        path.is_root() || self.strictly_below(path).next().is_some()
    }

    /// Files strictly below `path`. They form one run of the map starting at `path` + `/`;
    /// starting at `path` itself would first meet siblings such as `path.md` or `path-old/x`,
    /// which sort before `/`.
    fn strictly_below<'a>(
        &'a self,
        path: &'a VPath,
    ) -> impl Iterator<Item = (&'a VPath, &'a FileData)> {
        let start = if path.is_root() {
            String::from("/")
        } else {
            format!("{path}/")
        };
        self.files
            .range::<str, _>((Bound::Included(start.as_str()), Bound::Unbounded))
            .take_while(move |(p, _)| p.starts_with(path))
            .map(|(p, f)| (p, f.borrow()))
    }

    /// Files at or below `path`, in path order.
    pub fn below<'a>(&'a self, path: &'a VPath) -> impl Iterator<Item = (&'a VPath, &'a FileData)> {
        let at = if path.is_root() {
            None
        } else {
            self.files.get_key_value(path).map(|(p, f)| (p, f.borrow()))
        };
        at.into_iter().chain(self.strictly_below(path))
    }

    /// Checks that a file may be written at `path`: it is not a directory, and no ancestor is a
    /// file.
    pub fn check_writable(&self, path: &VPath) -> Result<(), BackendError> {
        if path.is_root() || (self.file(path).is_none() && self.is_dir(path)) {
            return Err(BackendError::IsDirectory {
                path: path.to_string(),
            });
        }
        let mut ancestor = path.parent();
        while let Some(dir) = ancestor {
            if self.file(&dir).is_some() {
                return Err(BackendError::NotADirectory {
                    path: dir.to_string(),
                });
            }
            ancestor = dir.parent();
        }
        Ok(())
    }

    /// Entries directly under `dir`.
    pub fn ls(&self, dir: &VPath) -> Result<Vec<FileInfo>, BackendError> {
        if self.file(dir).is_some() {
            return Err(BackendError::NotADirectory {
                path: dir.to_string(),
            });
        }
        if !self.is_dir(dir) {
            return Err(BackendError::NotFound {
                path: dir.to_string(),
            });
        }
        let mut entries: BTreeMap<String, FileInfo> = BTreeMap::new();
        for (path, file) in self.below(dir) {
            let Some(relative) = path.relative_to(dir) else {
                continue;
            };
            match relative.split_once('/') {
                None => {
                    entries.insert(path.to_string(), info(path, file));
                }
                Some((child, _)) => {
                    let child_path = if dir.is_root() {
                        format!("/{child}")
                    } else {
                        format!("{dir}/{child}")
                    };
                    let entry = entries.entry(child_path.clone()).or_insert(FileInfo {
                        path: child_path,
                        is_dir: true,
                        size: 0,
                        modified_at_ms: None,
                        broken_link: None,
                    });
                    entry.modified_at_ms = entry.modified_at_ms.max(Some(file.modified_at_ms));
                }
            }
        }
        Ok(entries.into_values().collect())
    }

    /// The file at `path`, or the right error for a missing file or a directory.
    pub fn existing(&self, path: &VPath) -> Result<&FileData, BackendError> {
        match self.file(path) {
            Some(file) => Ok(file),
            None if self.is_dir(path) => Err(BackendError::IsDirectory {
                path: path.to_string(),
            }),
            None => Err(BackendError::NotFound {
                path: path.to_string(),
            }),
        }
    }

    /// A page of the file at `path`. Text is paged whatever its size, as on disk, a page
    /// holding at most the size limit; a binary file is returned whole, so only within it.
    pub fn read(
        &self,
        path: &VPath,
        offset: usize,
        limit: usize,
    ) -> Result<ReadResult, BackendError> {
        let file = self.existing(path)?;
        Ok(match view(path, file) {
            View::Text(bytes) => {
                let budget = usize::try_from(self.max_file_size).unwrap_or(usize::MAX);
                let mut pager = text::Pager::new(offset, limit, budget);
                pager.feed(bytes);
                if pager.over_budget() {
                    return Err(BackendError::LineTooLong {
                        path: path.to_string(),
                        line: offset.saturating_add(1),
                        max: self.max_file_size,
                    });
                }
                pager.finish()
            }
            View::Binary { mime_type, data } => {
                self.check_limit(path, file)?;
                ReadResult::Binary {
                    mime_type: mime_type.to_owned(),
                    data: data.to_vec(),
                }
            }
        })
    }

    /// The bytes of the file at `path`.
    pub fn read_raw(&self, path: &VPath) -> Result<RawFile, BackendError> {
        Ok(match view(path, self.within_limit(path)?) {
            View::Text(bytes) => RawFile {
                mime_type: text_mime(bytes).to_owned(),
                data: bytes.to_vec(),
            },
            View::Binary { mime_type, data } => RawFile {
                mime_type: mime_type.to_owned(),
                data: data.to_vec(),
            },
        })
    }

    /// The new content of the file at `path` with `old` replaced by `new`, and the number of
    /// replacements. UTF-8 text is edited with [`text::replace`]; other text with
    /// [`text::replace_bytes`], which keeps every byte it does not replace (the result stays
    /// bytes unless it became valid UTF-8). Refuses binary files and results over the size
    /// limit.
    pub fn edit_content(
        &self,
        path: &VPath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<(FileContent, usize), BackendError> {
        let current = match view(path, self.within_limit(path)?) {
            View::Text(bytes) => bytes,
            View::Binary { mime_type, .. } => {
                return Err(BackendError::Binary {
                    path: path.to_string(),
                    mime_type: mime_type.to_owned(),
                });
            }
        };
        let (content, size, count) = match std::str::from_utf8(current) {
            Ok(text) => {
                let (updated, count) = text::replace(path.as_str(), text, old, new, replace_all)?;
                let size = updated.len();
                (FileContent::Text { text: updated }, size, count)
            }
            Err(_) => {
                let (updated, count) =
                    text::replace_bytes(path.as_str(), current, old, new, replace_all)?;
                let size = updated.len();
                let content = match String::from_utf8(updated) {
                    Ok(text) => FileContent::Text { text },
                    Err(e) => non_utf8_text(e.into_bytes()),
                };
                (content, size, count)
            }
        };
        self.check_size_to_write(path, size)?;
        Ok((content, count))
    }

    /// [`Self::edit_content`] for callers that store text as a string: an edit whose result is
    /// not valid UTF-8 is refused (nothing changes) rather than have its other bytes rewritten.
    pub fn edit(
        &self,
        path: &VPath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<(String, usize), BackendError> {
        match self.edit_content(path, old, new, replace_all)? {
            (FileContent::Text { text }, count) => Ok((text, count)),
            (FileContent::Binary { .. }, _) => Err(BackendError::NotUtf8 {
                path: path.to_string(),
                reason: "this backend stores edited files as UTF-8 text, which would rewrite \
                         those bytes, so nothing was changed. Delete the file and write it again with \
                         write_file"
                    .to_owned(),
            }),
        }
    }

    /// Files under `base` matching `pattern`.
    pub fn glob(&self, pattern: &str, base: &VPath) -> Result<GlobResult, BackendError> {
        let pattern = GlobPattern::new(pattern)?;
        let files = self
            .below(base)
            .filter(|(path, _)| {
                path.relative_to(base)
                    .is_some_and(|relative| !relative.is_empty() && pattern.matches(relative))
            })
            .map(|(path, file)| info(path, file))
            .collect();
        Ok(GlobResult {
            files,
            truncated: false,
        })
    }

    /// Lines matching `query` in text files; binary files the query covers are listed as
    /// skipped.
    pub fn grep(&self, query: &GrepQuery) -> Result<GrepResult, BackendError> {
        let matcher = LineMatcher::new(query)?;
        let include = query.include.as_deref().map(GlobPattern::new).transpose()?;
        let mut result = GrepResult::default();
        if self.file(&query.path).is_none() && !self.is_dir(&query.path) {
            return Err(BackendError::NotFound {
                path: query.path.to_string(),
            });
        }
        for (path, file) in self.below(&query.path) {
            if let Some(include) = &include {
                let relative = path.relative_to(&query.path).unwrap_or_default();
                let name = path.file_name().unwrap_or_default();
                let target = if relative.is_empty() { name } else { relative };
                if !include.matches(target) {
                    continue;
                }
            }
            let bytes = match view(path, file) {
                View::Text(bytes) => bytes,
                View::Binary { mime_type, .. } => {
                    result.skipped.push(SkippedFile {
                        path: path.to_string(),
                        reason: SkipReason::Binary {
                            mime_type: mime_type.to_owned(),
                        },
                    });
                    continue;
                }
            };
            if matcher.search_bytes(path.as_str(), bytes, &mut result.matches, query.max_count) {
                result.truncated = true;
                break;
            }
        }
        result.trim_skipped(query.max_count);
        Ok(result)
    }

    /// The bytes of each file in `paths` (as given, so each may fail to parse), in order.
    pub fn download_files(&self, paths: Vec<String>) -> Vec<Result<Vec<u8>, FileOpError>> {
        paths
            .into_iter()
            .map(|raw| {
                let path = VPath::parse(&raw).map_err(|_| FileOpError::InvalidPath)?;
                self.read_raw(&path)
                    .map(|raw| raw.data)
                    .map_err(|e| e.file_op_code())
            })
            .collect()
    }

    /// The files a recursive delete of `path` removes.
    pub fn delete_set(&self, path: &VPath) -> Result<Vec<VPath>, BackendError> {
        if path.is_root() {
            return Err(BackendError::PermissionDenied {
                path: "/".to_owned(),
                reason: "the root cannot be deleted; delete its entries one by one".to_owned(),
            });
        }
        let doomed: Vec<VPath> = self.below(path).map(|(p, _)| p.clone()).collect();
        if doomed.is_empty() {
            return Err(BackendError::NotFound {
                path: path.to_string(),
            });
        }
        Ok(doomed)
    }
}

impl MemoryTree<FileData> {
    /// Puts `file` at `path`, for a backend that keeps its tree between calls.
    pub fn insert(&mut self, path: VPath, file: FileData) {
        self.files.insert(path, file);
    }

    /// Removes the file at `path`.
    pub fn remove(&mut self, path: &VPath) {
        self.files.remove(path);
    }
}

/// `FileData` for `bytes` written at `path`: a string when it is UTF-8 text, bytes otherwise
/// (typed [`mime::NON_UTF8_TEXT_MIME`] when they are text that is not UTF-8).
pub fn file_data(path: &VPath, bytes: Vec<u8>, modified_at_ms: u64) -> FileData {
    let content = match mime::binary_type(path.as_str(), &bytes) {
        Some(mime_type) => FileContent::Binary {
            mime_type: mime_type.to_owned(),
            data: bytes,
        },
        None => match String::from_utf8(bytes) {
            Ok(text) => FileContent::Text { text },
            Err(e) => non_utf8_text(e.into_bytes()),
        },
    };
    FileData {
        content,
        modified_at_ms,
        created_at_ms: modified_at_ms,
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
