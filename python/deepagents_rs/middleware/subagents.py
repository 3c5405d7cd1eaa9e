"""Subagent descriptions at the reference's path (``deepagents.middleware.subagents``)."""

from __future__ import annotations

from typing import Any, Literal, Sequence, TypedDict

from ._unsupported import unsupported


class _Named(TypedDict):
    name: str
    description: str


# `async` is a keyword, so the key can only be declared this way.
_AsyncFlag = TypedDict("_AsyncFlag", {"async": bool}, total=False)


class SubAgent(_Named, _AsyncFlag, total=False):
    """A subagent for ``create_deep_agent(subagents=[…])``: the ``task`` tool starts it
    by ``name``; the model chooses it by ``description``. The rest is optional: its own
    ``system_prompt``, ``tools``, ``model``, ``interrupt_on``, ``skills``, ``permissions``,
    ``response_format`` and ``mode`` (``"isolated"``, the default, or ``"fork"``: it continues
    the agent's conversation under the agent's prompt, its own ``system_prompt`` appended).
    ``"async": True`` makes it an async subagent: ``start_async_task`` starts it in the
    background and its ending is delivered to the thread (see ``DeepAgent.wait_for_background``).
    ``middleware`` is refused."""

    system_prompt: str
    tools: Sequence[Any]
    model: Any
    middleware: list[Any]
    interrupt_on: dict[str, Any]
    skills: list[str]
    permissions: list[Any]
    response_format: Any
    mode: Literal["isolated", "fork"]


class CompiledSubAgent(_Named, total=False):
    """The reference's prebuilt subagent (a LangGraph runnable). ``create_deep_agent``
    refuses it here: describe the subagent as a ``SubAgent`` instead."""

    runnable: Any
    mode: Literal["isolated", "fork"]


__all__ = ["CompiledSubAgent", "SubAgent"]


def __getattr__(name: str) -> Any:
    return unsupported(__name__, name)
