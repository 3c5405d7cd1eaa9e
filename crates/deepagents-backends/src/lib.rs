//! The pluggable filesystem of deepagents.
//!
//! The agent sees one tree of absolute virtual paths ([`VPath`]); a [`Backend`] decides where
//! each path really lives:
//!
//! - [`StateBackend`]: files in the agent state (per thread, checkpointed with it);
//! - [`FilesystemBackend`]: a directory on disk, confined to its root;
//! - [`LocalShellBackend`]: the same plus `execute` through a local shell ([`Sandbox`]);
//! - [`StoreBackend`]: a namespaced key-value [`Store`] shared across threads;
//! - [`RepoBackend`]: a git repository, one commit per change, with linked skill repositories;
//! - [`CompositeBackend`]: several of these routed by path prefix.
//!
//! [`PermissionedBackend`] enforces permission rules over any backend, and [`PolicyBackend`]
//! runs user checks around any backend.

mod composite;
mod confine;
mod delegate;
mod filtered;
pub mod glob;
pub mod memory;
pub mod mime;
mod path;
mod per_run;
pub mod permissions;
mod policy;
mod protect;
mod protocol;
pub mod repo;
mod state;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub mod text;

pub use composite::CompositeBackend;
/// The confinement of `execute` ([`LocalShellBackend::with_sandbox`]).
pub use deepagents_sandbox as sandbox;
pub use path::{PathError, VPath};
pub use per_run::{BackendFactory, PerRunBackend};
pub use permissions::{Mode, Operation, PermissionRule, PermissionedBackend, Permissions};
pub use policy::{BackendOp, BackendPolicy, PolicyBackend, ReadOnlyPolicy};
pub use protocol::{
    Backend, BackendContext, BackendError, BrokenLink, Changed, DEFAULT_GREP_MAX_COUNT,
    DEFAULT_MAX_FILE_SIZE, ExecuteResult, FileInfo, FileOpError, GlobResult, GrepMatch, GrepQuery,
    GrepResult, OutputSink, PathMapping, RawFile, ReadResult, Sandbox, SkipReason, SkippedFile,
};
pub use repo::{RepoBackend, RepoBackendBuilder, RepoCommit};
pub use state::StateBackend;
pub use store::{InMemoryStore, Store, StoreBackend};
#[cfg(feature = "postgres")]
pub use store::{PostgresCheckpointer, PostgresStore};
#[cfg(feature = "sqlite")]
pub use store::{SqliteCheckpointer, SqliteStore};

mod filesystem;
mod shell;
mod walk;
pub use filesystem::{FilesystemBackend, FilesystemBackendBuilder};
pub use shell::LocalShellBackend;
