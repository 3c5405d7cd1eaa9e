//! Deep-agent runs in LangGraph's terms, for the front ends that speak them: the agent server
//! (the LangGraph Platform API) and the Python package (`create_deep_agent`'s `invoke` and
//! `stream`).
//!
//! - [`convert`]: messages as LangChain message dicts with stable ids (`msg-N`), a run's state
//!   as `values`, pending approvals as interrupts, resume payloads as decisions, input
//!   messages and state updates back into a run.
//! - [`Framer`]: a run's events and saved steps as the frames of the stream modes
//!   ([`MODES`]), into any [`FrameSink`].
//! - [`StepWatch`]: a checkpointer wrapper that hands each saved step's run to whoever drives
//!   it, so `values` and `updates` need no read back.

pub mod convert;
mod stream;
mod watch;

pub use stream::{FrameSink, Framer, MODES};
pub use watch::{Step, StepWatch, Subscription};
