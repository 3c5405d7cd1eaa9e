"""The reference's `deepagents.middleware.async_subagents`: LangGraph middleware this package does not
provide; importing a name from it raises `ImportError` naming the alternative."""

from typing import Any

from ._unsupported import unsupported


def __getattr__(name: str) -> Any:
    return unsupported(__name__, name)
