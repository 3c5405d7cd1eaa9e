"""The reference's ``deepagents.middleware``: the subagent descriptions (``AsyncSubAgent``
too) and ``FilesystemPermission``. The middleware classes themselves are LangGraph middleware and are
not provided: importing one raises ``ImportError`` naming the ``create_deep_agent`` argument
that does the same here."""

from typing import Any

from ._unsupported import unsupported
from .async_subagents import AsyncSubAgent
from .filesystem import FilesystemPermission, FsToolName
from .subagents import CompiledSubAgent, SubAgent

__all__ = ["AsyncSubAgent", "CompiledSubAgent", "FilesystemPermission", "FsToolName", "SubAgent"]


def __getattr__(name: str) -> Any:
    return unsupported(__name__, name)
