"""The reference's ``deepagents.backends.sandbox``: ``BaseSandbox`` (file operations built
on a subclass's ``execute``) is not provided here."""

from typing import Any

from .._protocol import ExecuteResponse, SandboxBackendProtocol

__all__ = ["ExecuteResponse", "SandboxBackendProtocol"]


def __getattr__(name: str) -> Any:
    if name == "BaseSandbox":
        raise ImportError(
            "deepagents_rs does not provide BaseSandbox: subclass"
            " deepagents_rs.backends.protocol.SandboxBackendProtocol and implement ls, read, write,"
            " edit, glob, grep and execute, or use LocalShellBackend(root_dir=…, sandbox=True)"
            " for commands confined to a directory"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
