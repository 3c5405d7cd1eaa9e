"""Where an agent's files live, at the reference's paths (``deepagents.backends``): the
built-in backends, which also answer the protocol's methods when called directly, and the
protocol for backends written in Python."""

from typing import Any

from .._backends import (
    CompositeBackend,
    FilesystemBackend,
    LocalShellBackend,
    NamespaceFactory,
    StateBackend,
    StoreBackend,
)
from .._protocol import BackendProtocol, SandboxBackendProtocol
from .local_shell import DEFAULT_EXECUTE_TIMEOUT

__all__ = [
    "DEFAULT_EXECUTE_TIMEOUT",
    "BackendProtocol",
    "CompositeBackend",
    "FilesystemBackend",
    "LocalShellBackend",
    "NamespaceFactory",
    "SandboxBackendProtocol",
    "StateBackend",
    "StoreBackend",
]

_UNSUPPORTED = {
    "ContextHubBackend": "LangSmith Context Hub is not reached from here; use StoreBackend(store=…) for files kept across threads",
    "LangSmithSandbox": "LangSmith sandboxes are not reached from here; use LocalShellBackend(root_dir=…, sandbox=True), or your own SandboxBackendProtocol subclass",
}


def __getattr__(name: str) -> Any:
    if name in _UNSUPPORTED:
        raise ImportError(f"deepagents_rs does not provide {name}: {_UNSUPPORTED[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
