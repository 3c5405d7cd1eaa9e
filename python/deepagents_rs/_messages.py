"""Messages, interrupts and commands as Python values."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any, Mapping

_ROLES = {"human": "user", "ai": "assistant", "tool": "tool", "system": "system"}
_TYPES = {"user": "human", "assistant": "ai", "tool": "tool", "system": "system", "developer": "system"}


class Message(dict):  # type: ignore[type-arg]
    """A message as a dict (``role``, ``content``, ``tool_calls``, ``tool_call_id``, …, and
    LangChain's ``type`` and ``id``), whose keys also read as attributes
    (``message.content``), as LangChain message objects do."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            if key in ("tool_calls", "invalid_tool_calls"):
                return []
            if key in ("tool_call_id", "name", "id", "status"):
                return None
            raise AttributeError(key) from None

    @property
    def text(self) -> str:
        """The text of the content."""
        content = self.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(
                part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text"
            )
        return ""


_MISSING = object()
_LANGCHAIN_ABSENT = False


def _langchain_messages() -> Any:
    """``langchain_core.messages`` when it can be imported, else ``None`` (looked for once;
    a ``None`` in ``sys.modules`` hides it, as Python's import system has it)."""
    global _LANGCHAIN_ABSENT
    module = sys.modules.get("langchain_core.messages", _MISSING)
    # A module another thread is still importing (a tool of a background task) is in
    # sys.modules half made: the import below waits for it instead.
    if module is not _MISSING and not getattr(getattr(module, "__spec__", None), "_initializing", False):
        return module
    if _LANGCHAIN_ABSENT:
        return None
    try:
        import langchain_core.messages as module  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        _LANGCHAIN_ABSENT = True
        return None
    return module


def message_from_wire(value: Mapping[str, Any]) -> Any:
    """A message from the native side as LangChain's reference returns it: a
    ``langchain_core.messages`` object (``HumanMessage``, ``AIMessage``, ``ToolMessage``,
    ``SystemMessage``, ``AIMessageChunk``) when ``langchain_core`` is importable, else a
    :class:`Message` dict."""
    lc = _langchain_messages()
    if lc is not None:
        try:
            converted = _to_langchain(lc, value)
        except (TypeError, ValueError):
            converted = None
        if converted is not None:
            return converted
    message = Message(value)
    kind = message.get("type")
    if isinstance(kind, str):
        message.setdefault("role", _ROLES.get(kind, "assistant" if kind == "AIMessageChunk" else kind))
    return message


def _to_langchain(lc: Any, value: Mapping[str, Any]) -> Any:
    kind = value.get("type")
    common: dict[str, Any] = {"content": value.get("content", "")}
    for key in ("id", "name", "additional_kwargs", "response_metadata"):
        if value.get(key) is not None:
            common[key] = value[key]
    if kind == "human":
        return lc.HumanMessage(**common)
    if kind == "system":
        return lc.SystemMessage(**common)
    if kind == "tool":
        return lc.ToolMessage(tool_call_id=value.get("tool_call_id") or "", status=value.get("status") or "success", **common)
    if kind == "ai":
        calls, invalid = [], list(value.get("invalid_tool_calls") or [])
        for call in value.get("tool_calls") or []:
            args = call.get("args")
            if isinstance(args, dict):
                calls.append({"type": "tool_call", "id": call.get("id"), "name": call.get("name", ""), "args": args})
            else:
                invalid.append({"type": "invalid_tool_call", "id": call.get("id"), "name": call.get("name"), "args": args if isinstance(args, str) else json.dumps(args), "error": "the arguments are not an object"})
        extra: dict[str, Any] = {}
        if value.get("usage_metadata") is not None:
            extra["usage_metadata"] = value["usage_metadata"]
        return lc.AIMessage(tool_calls=calls, invalid_tool_calls=invalid, **extra, **common)
    if kind == "AIMessageChunk":
        chunks = [
            {"type": "tool_call_chunk", "id": c.get("id"), "name": c.get("name"), "args": c.get("args"), "index": c.get("index")}
            for c in value.get("tool_call_chunks") or []
        ]
        extra = {}
        if value.get("usage_metadata") is not None:
            extra["usage_metadata"] = value["usage_metadata"]
        return lc.AIMessageChunk(tool_call_chunks=chunks, **extra, **common)
    return None


def values_from_wire(values: Any) -> Any:
    """A state from the native side: messages as LangChain message objects (or
    :class:`Message` dicts without ``langchain_core``), interrupts as :class:`Interrupt`."""
    if not isinstance(values, dict):
        return values
    out = dict(values)
    if isinstance(out.get("messages"), list):
        out["messages"] = [message_from_wire(m) for m in out["messages"]]
    if isinstance(out.get("__interrupt__"), list):
        out["__interrupt__"] = [Interrupt(value=i.get("value"), id=i.get("id", "")) for i in out["__interrupt__"]]
    return out


def message_to_wire(message: Any) -> dict[str, Any]:
    """A message given to ``invoke``: a dict with ``role`` or ``type``, a ``(role, content)``
    pair, a plain string (a user message) or a LangChain message object."""
    if isinstance(message, str):
        return {"type": "human", "content": message}
    if isinstance(message, (tuple, list)) and len(message) == 2 and isinstance(message[0], str):
        role, content = message
        return {"type": _TYPES.get(role, role), "content": content}
    if isinstance(message, Mapping):
        out = dict(message)
        role = out.pop("role", None)
        if "type" not in out:
            out["type"] = _TYPES.get(role or "user", role or "human")
        return _plain(out)
    if hasattr(message, "type") and hasattr(message, "content"):
        out = {"type": message.type, "content": message.content}
        for key in ("tool_calls", "tool_call_id", "name", "id", "status"):
            value = getattr(message, key, None)
            if value:
                out[key] = value
        return _plain(out)
    raise TypeError(
        f"cannot read a message from {type(message).__name__}; use {{'role': 'user', 'content': '…'}}"
    )


def _plain(value: dict[str, Any]) -> dict[str, Any]:
    if value.get("id") is None:
        value.pop("id", None)
    return value


def input_to_wire(input: Any) -> Any:
    """``invoke``'s input: ``{"messages": […]}`` (other keys ignored), a list of messages, a
    string, or ``None`` to continue a thread."""
    if input is None:
        return None
    if isinstance(input, str):
        return {"messages": [message_to_wire(input)]}
    if isinstance(input, list):
        return {"messages": [message_to_wire(m) for m in input]}
    if isinstance(input, Mapping):
        messages = input.get("messages")
        if messages is None:
            messages = []
        if isinstance(messages, (str, Mapping)) or not isinstance(messages, (list, tuple)):
            messages = [messages]
        wire: dict[str, Any] = {"messages": [message_to_wire(m) for m in messages]}
        # State to seed the thread with: files by path (text, or {"content": …}), todos.
        if input.get("files") is not None:
            wire["files"] = {path: _file_to_wire(f) for path, f in dict(input["files"]).items()}
        if input.get("todos") is not None:
            wire["todos"] = list(input["todos"])
        return wire
    raise TypeError(
        f"invoke() takes {{'messages': [...]}}, a Command, or None; got {type(input).__name__}"
    )


def _file_to_wire(file: Any) -> Any:
    if file is None or isinstance(file, str):
        return file
    if isinstance(file, Mapping):
        return dict(file)
    content = getattr(file, "content", None)
    if content is not None:
        return {"content": content}
    raise TypeError(f"a file is text or {{'content': …}}, not {type(file).__name__}")


@dataclasses.dataclass(frozen=True)
class Interrupt:
    """A pause for approval: ``value`` holds ``action_requests`` (name, args, description of
    each call) and ``review_configs`` (the decisions each allows)."""

    value: Any
    id: str = ""


@dataclasses.dataclass(frozen=True)
class Command:
    """Continues an interrupted thread: ``resume={"decisions": [{"type": "approve"}, …]}``,
    one decision per pending action (``approve``, ``edit`` with ``edited_action``,
    ``reject`` with ``message``, ``respond`` with ``message``). Keyed by the interrupt's id,
    ``resume={interrupt.id: {"decisions": […]}}``, it answers only that interrupt: one that
    is no longer pending raises :class:`InvalidRequest` and nothing runs."""

    resume: Any = None
    update: Any = None
    goto: Any = None


class ToolRuntime:
    """What a tool that takes a ``runtime`` parameter gets: the call's id, the run's
    ``context`` object, its ``config`` (the thread id) and the ``state`` as the step began."""

    def __init__(self, native: Any) -> None:
        self._native = native
        self.tool_call_id: str = native.tool_call_id
        self.context: Any = native.context
        thread_id = native.thread_id
        self.config: dict[str, Any] = {"configurable": {"thread_id": thread_id} if thread_id else {}}
        self._state: dict[str, Any] | None = None

    @property
    def state(self) -> dict[str, Any]:
        """The state (``messages``, ``todos``, ``files``) as the step began."""
        if self._state is None:
            self._state = values_from_wire(json.loads(self._native.state_json()))
        return self._state
