"""deepagents-rs for Python: LangChain deepagents' ``create_deep_agent`` API on the Rust
harness (planning, a virtual filesystem over pluggable backends, subagents, context
engineering, approvals, crash-safe threads, spend caps)."""

from ._agent import (
    AgentError,
    DeepAgent,
    GraphOutput,
    InvalidRequest,
    ScriptedModel,
    SpendCapExceeded,
    StateSnapshot,
    create_deep_agent,
)
from ._backends import (
    CompositeBackend,
    FilesystemBackend,
    FilesystemPermission,
    InMemorySaver,
    InMemoryStore,
    LocalShellBackend,
    MemorySaver,
    PostgresSaver,
    PostgresStore,
    SqliteSaver,
    SqliteStore,
    StateBackend,
    StoreBackend,
)
from ._messages import Command, Interrupt, Message, ToolRuntime
from ._native import __version__

__all__ = [
    "AgentError",
    "Command",
    "CompositeBackend",
    "DeepAgent",
    "FilesystemBackend",
    "FilesystemPermission",
    "GraphOutput",
    "InMemorySaver",
    "InMemoryStore",
    "Interrupt",
    "InvalidRequest",
    "LocalShellBackend",
    "MemorySaver",
    "Message",
    "PostgresSaver",
    "PostgresStore",
    "ScriptedModel",
    "SpendCapExceeded",
    "SqliteSaver",
    "SqliteStore",
    "StateBackend",
    "StateSnapshot",
    "StoreBackend",
    "ToolRuntime",
    "__version__",
    "create_deep_agent",
]
