"""The reference's ``deepagents.middleware.async_subagents``: the ``AsyncSubAgent`` spec of a
subagent on an Agent Protocol server, which ``create_deep_agent(subagents=[…])`` takes. The
middleware itself is LangGraph middleware and is not provided: importing it raises
``ImportError`` naming the alternative."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from ._unsupported import unsupported


class _Required(TypedDict):
    name: str
    description: str
    graph_id: str


class AsyncSubAgent(_Required, total=False):
    """An async subagent on an Agent Protocol server (LangGraph Platform or self-hosted):
    the model starts it with ``start_async_task`` and goes on; its ending is delivered to the
    thread. ``url`` is required here (the reference's in-process transport exists only inside
    its own server); ``x-auth-scheme: langsmith`` and the ``x-api-key`` of
    ``LANGGRAPH_API_KEY``/``LANGSMITH_API_KEY``/``LANGCHAIN_API_KEY`` are sent unless
    ``headers`` set them. ``update_strategy="enqueue"``, ``webhook``,
    ``notify_parent=False`` and ``mode="fork"`` are refused."""

    url: str
    headers: dict[str, str]
    webhook: str
    update_strategy: Literal["interrupt", "enqueue"]
    notify_parent: bool
    mode: Literal["isolated", "fork"]


__all__ = ["AsyncSubAgent"]


def __getattr__(name: str) -> Any:
    return unsupported(__name__, name)
