//! Read-side operations over a map of whole files, shared by the backends that keep files as
//! values (state and store). Directories are implied by the paths of the files below them.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::ops::Bound;

use deepagents_core::{FileContent, FileData};

use crate::glob::GlobPattern;
use crate::mime::{self, Classified};
use crate::path::VPath;
use crate::protocol::{
    BackendError, DEFAULT_MAX_FILE_SIZE, FileInfo, FileOpError, GlobResult, GrepQuery, GrepResult,
    RawFile, ReadResult,
};
use crate::text::{self, LineMatcher};

/// Files by path; `F` is `FileData` or a reference to one.
#[derive(Debug)]
pub struct MemoryTree<F> {
    files: BTreeMap<VPath, F>,
    max_file_size: u64,
}

/// A file as the agent sees it. Text kept as a string is still binary when its name or content
/// says so (see [`mime`]), so these backends answer as the disk backend does for the same bytes.
enum View<'a> {
    Text(&'a str),
    Binary { mime_type: &'a str, data: &'a [u8] },
}

fn view<'a>(path: &VPath, file: &'a FileData) -> View<'a> {
    match &file.content {
        FileContent::Text { text } => match mime::binary_type_of_text(path.as_str(), text) {
            None => View::Text(text),
            Some(mime_type) => View::Binary {
                mime_type,
                data: text.as_bytes(),
            },
        },
        FileContent::Binary { mime_type, data } => View::Binary { mime_type, data },
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
        let size = size_of(file);
        if size > self.max_file_size {
            return Err(BackendError::TooLarge {
                path: path.to_string(),
                size,
                max: self.max_file_size,
            });
        }
        Ok(file)
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

    /// A page of the file at `path`.
    pub fn read(
        &self,
        path: &VPath,
        offset: usize,
        limit: usize,
    ) -> Result<ReadResult, BackendError> {
        Ok(match view(path, self.within_limit(path)?) {
            View::Text(text) => text::page(text, offset, limit),
            View::Binary { mime_type, data } => ReadResult::Binary {
                mime_type: mime_type.to_owned(),
                data: data.to_vec(),
            },
        })
    }

    /// The bytes of the file at `path`.
    pub fn read_raw(&self, path: &VPath) -> Result<RawFile, BackendError> {
        Ok(match view(path, self.within_limit(path)?) {
            View::Text(text) => RawFile {
                mime_type: mime::TEXT_MIME.to_owned(),
                data: text.as_bytes().to_vec(),
            },
            View::Binary { mime_type, data } => RawFile {
                mime_type: mime_type.to_owned(),
                data: data.to_vec(),
            },
        })
    }

    /// The new text of the file at `path` with `old` replaced by `new` (see
    /// [`text::replace`]), and the number of replacements. Refuses binary files and results over
    /// the size limit.
    pub fn edit(
        &self,
        path: &VPath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<(String, usize), BackendError> {
        let current = match view(path, self.within_limit(path)?) {
            View::Text(text) => text,
            View::Binary { mime_type, .. } => {
                return Err(BackendError::Binary {
                    path: path.to_string(),
                    mime_type: mime_type.to_owned(),
                });
            }
        };
        let (updated, count) = text::replace(path.as_str(), current, old, new, replace_all)?;
        self.check_size_to_write(path, updated.len())?;
        Ok((updated, count))
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

    /// Lines matching `query` in text files.
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
            let View::Text(text) = view(path, file) else {
                continue;
            };
            if let Some(include) = &include {
                let relative = path.relative_to(&query.path).unwrap_or_default();
                let name = path.file_name().unwrap_or_default();
                let target = if relative.is_empty() { name } else { relative };
                if !include.matches(target) {
                    continue;
                }
            }
            if matcher.search(path.as_str(), text, &mut result.matches, query.max_count) {
                result.truncated = true;
                break;
            }
        }
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

/// `FileData` for `bytes` written at `path`: text when it is UTF-8 text, binary otherwise.
pub fn file_data(path: &VPath, bytes: Vec<u8>, modified_at_ms: u64) -> FileData {
    let content = match mime::classify(path.as_str(), bytes.clone()) {
        Classified::Text(text) => FileContent::Text { text },
        Classified::Binary { mime_type } => FileContent::Binary {
            mime_type,
            data: bytes,
        },
    };
    FileData {
        content,
        modified_at_ms,
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
