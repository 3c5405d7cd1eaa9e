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
    BackendError, FileInfo, FileOpError, GlobResult, GrepQuery, GrepResult, RawFile, ReadResult,
};
use crate::text::{self, LineMatcher};

/// Files by path; `F` is `FileData` or a reference to one.
#[derive(Debug)]
pub struct MemoryTree<F> {
    files: BTreeMap<VPath, F>,
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
    /// A tree over `files`.
    pub fn new(files: BTreeMap<VPath, F>) -> Self {
        Self { files }
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
        Ok(match &self.existing(path)?.content {
            FileContent::Text { text } => text::page(text, offset, limit),
            FileContent::Binary { mime_type, data } => ReadResult::Binary {
                mime_type: mime_type.clone(),
                data: data.clone(),
            },
        })
    }

    /// The bytes of the file at `path`.
    pub fn read_raw(&self, path: &VPath) -> Result<RawFile, BackendError> {
        Ok(match &self.existing(path)?.content {
            FileContent::Text { text } => RawFile {
                mime_type: mime::mime_type(path.as_str(), text.as_bytes()),
                data: text.as_bytes().to_vec(),
            },
            FileContent::Binary { mime_type, data } => RawFile {
                mime_type: mime_type.clone(),
                data: data.clone(),
            },
        })
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
            let FileContent::Text { text } = &file.content else {
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
