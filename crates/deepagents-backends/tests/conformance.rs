//! The conformance suite lives in the crate (`testing`, for users' backends too); the
//! backend-specific modules use it from here.

pub use deepagents_backends::testing::*;
