"""``FilesystemPermission`` at the reference's path (``deepagents.middleware.filesystem``);
``FilesystemMiddleware`` is not provided (the file tools are built in)."""

from __future__ import annotations

from typing import Any, Literal

from .._backends import FilesystemPermission
from ._unsupported import unsupported

FsToolName = Literal["ls", "read_file", "write_file", "edit_file", "delete", "glob", "grep", "execute"]
"""The file tools' names."""

__all__ = ["FilesystemPermission", "FsToolName"]


def __getattr__(name: str) -> Any:
    return unsupported(__name__, name)
