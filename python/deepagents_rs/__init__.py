"""deepagents-rs for Python: LangChain deepagents' ``create_deep_agent`` API on the Rust
harness (planning, a virtual filesystem over pluggable backends, subagents, context
engineering, approvals, crash-safe threads, spend caps)."""

from typing import Any

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
from ._tools import interrupt, mutating
from ._native import __version__
from .graph import DeepAgentState
from .middleware import AsyncSubAgent, CompiledSubAgent, FsToolName, SubAgent
from .middleware._unsupported import unsupported as _unsupported

__all__ = [
    "AgentError",
    "AsyncSubAgent",
    "Command",
    "CompiledSubAgent",
    "CompositeBackend",
    "DeepAgent",
    "DeepAgentState",
    "FilesystemBackend",
    "FilesystemPermission",
    "FsToolName",
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
    "SubAgent",
    "ToolRuntime",
    "__version__",
    "create_deep_agent",
    "interrupt",
    "mutating",
]


def __getattr__(name: str) -> Any:
    # The reference's middleware and profile names: ImportError naming what to use instead.
    return _unsupported(__name__, name)
