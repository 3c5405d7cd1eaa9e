"""``create_deep_agent`` at the reference's path (``deepagents.graph``)."""

from __future__ import annotations

from typing import Any, TypedDict

from ._agent import create_deep_agent


class DeepAgentState(TypedDict, total=False):
    """The state of a deep agent's thread, as ``invoke`` returns it."""

    messages: list[Any]
    files: dict[str, Any]
    todos: list[dict[str, Any]]
    structured_response: Any


__all__ = ["DeepAgentState", "create_deep_agent"]
