"""Custom middleware: LangChain ``AgentMiddleware`` objects (and what ``@before_model``,
``@after_model``, ``@wrap_model_call``, ``@wrap_tool_call``, ``@dynamic_prompt``,
``@before_agent`` and ``@after_agent`` make) run by the harness.

Each object gets an adapter the native side calls, with JSON, for the hooks the object
overrides (sync or async): ``before_agent``, ``before_model``, ``after_model``,
``after_agent``, ``wrap_model_call`` and ``wrap_tool_call``. What a hook returns is read as
LangGraph reads it: ``messages`` merged by id (``RemoveMessage``, ``REMOVE_ALL_MESSAGES``),
``todos``, ``files``, the keys of the middleware's ``state_schema``, and ``jump_to: "end"``.

Not supported, refused with a message when used: ``jump_to`` other than ``"end"``, state
changes from ``after_model`` other than replacing the model's message, state changes from
``after_agent``, a ``Command`` returned from ``wrap_tool_call`` or with
``ExtendedModelResponse``, and middleware on subagents.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import typing
import uuid
from typing import Any, Callable

from ._messages import Message, ToolRuntime, message_from_wire, message_to_wire, values_from_wire
from ._models import ai_to_wire
from ._tools import background_loop

# Keys of the state the harness keeps itself, or LangGraph's own.
_OWN_KEYS = {"messages", "todos", "files", "jump_to", "structured_response", "remaining_steps"}
_HOOKS = ("before_agent", "before_model", "after_model", "after_agent", "wrap_model_call", "wrap_tool_call")


def _module(name: str) -> Any:
    """A LangChain or LangGraph module, ``None`` when it is not installed (typed ``Any``: the
    adapter passes their objects through without depending on their annotations)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _base() -> Any:
    module = _module("langchain.agents.middleware")
    return None if module is None else module.AgentMiddleware


def _overrides(middleware: Any, method: str) -> bool:
    base = _base()
    own = getattr(type(middleware), method, None)
    if own is None:
        return False
    return base is None or own is not getattr(base, method, None)


def _state_keys(middleware: Any) -> list[str]:
    schema = getattr(middleware, "state_schema", None)
    if schema is None:
        return []
    try:
        hints = typing.get_type_hints(schema)
    except Exception:  # noqa: BLE001 - unresolvable hints: the raw annotations
        hints = dict(getattr(schema, "__annotations__", {}))
    return [key for key in hints if key not in _OWN_KEYS]


class ToolSchema(dict):  # type: ignore[type-arg]
    """A tool offered to the model, as a ``wrap_model_call`` hook sees it in
    ``request.tools``: a dict (``name``, ``description``, ``parameters``) whose keys read as
    attributes too (``tool.name``)."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


class NativeModel:
    """``request.model`` in a ``wrap_model_call`` hook when the agent's model is a spec
    string: the harness's own client. Replace it with a LangChain chat model
    (``request.override(model=…)``) and the handler calls that model instead."""

    def __init__(self, spec: str) -> None:
        self.model_name = spec

    def __repr__(self) -> str:
        return f"NativeModel({self.model_name!r})"


def _runtime(native: Any) -> Any:
    module = _module("langgraph.runtime")
    if module is None:
        return ToolRuntime(native)
    return module.Runtime(context=native.context, store=None)


def _text(message: Any) -> str:
    text = getattr(message, "text", None)
    if isinstance(text, str):
        return str(text)
    if callable(text):
        text = text()
    if isinstance(text, str):
        return text
    content = getattr(message, "content", "")
    return content if isinstance(content, str) else str(content)


def _add_messages(left: list[Any], right: list[Any]) -> list[Any]:
    """LangGraph's ``add_messages``: messages replace those with their id, ``RemoveMessage``
    removes (``REMOVE_ALL_MESSAGES`` everything before it), the rest are appended."""
    module = _module("langgraph.graph.message")
    if module is not None:
        return list(module.add_messages(left, right))
    merged = list(left)
    for message in right:
        wire = message_to_wire(message)
        if wire.get("type") == "remove":
            if wire.get("id") == "__remove_all__":
                merged = []
            else:
                merged = [m for m in merged if getattr(m, "id", None) != wire.get("id")]
            continue
        ids = [getattr(m, "id", None) or (m.get("id") if isinstance(m, dict) else None) for m in merged]
        if wire.get("id") in ids:
            merged[ids.index(wire["id"])] = message
        else:
            merged.append(message)
    return merged


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(message_to_wire(a) == message_to_wire(b))
    except TypeError:
        return False


class MessageCache:
    """LangChain message objects already made, by what they were made from: a thread's
    messages keep their ids, so each step converts only the new ones (building a LangChain
    message costs tens of microseconds; a long thread has hundreds)."""

    LIMIT = 20_000

    def __init__(self) -> None:
        self._made: dict[tuple[Any, ...], Any] = {}

    def message(self, wire: dict[str, Any]) -> Any:
        content = wire.get("content")
        key = (
            wire.get("id"),
            wire.get("type"),
            content if isinstance(content, str) else json.dumps(content, sort_keys=True),
            json.dumps(wire.get("tool_calls"), sort_keys=True) if wire.get("tool_calls") else None,
            wire.get("tool_call_id"),
            wire.get("status"),
        )
        if key[0] is None:
            return message_from_wire(wire)
        made = self._made.get(key)
        if made is None:
            if len(self._made) >= self.LIMIT:
                self._made.clear()
            made = self._made[key] = message_from_wire(wire)
        return made

    def values(self, wire: Any) -> Any:
        if isinstance(wire, dict) and isinstance(wire.get("messages"), list):
            messages = [self.message(m) for m in wire["messages"]]
            values = values_from_wire(dict(wire, messages=[]))
            values["messages"] = messages
            return values
        return values_from_wire(wire)


class MiddlewareAdapter:
    """What the native side calls for one middleware object."""

    def __init__(self, middleware: Any, model: Any, tools: dict[str, Any]) -> None:
        self.middleware = middleware
        self.name = str(getattr(middleware, "name", None) or type(middleware).__name__)
        self.model = model
        self.tools = tools
        self.state_keys = _state_keys(middleware)
        # The keys every middleware of the agent declares: any of them may update any.
        self.all_state_keys: list[str] = []
        self.hooks = {hook: _overrides(middleware, hook) or _overrides(middleware, f"a{hook}") for hook in _HOOKS}
        self.cache = MessageCache()

    # --- calling the user's hook, sync or async --------------------------------------------

    def _call(self, hook: str, native: Any, *args: Any) -> Any:
        if _overrides(self.middleware, hook):
            return getattr(self.middleware, hook)(*args)
        loop = native.event_loop or background_loop()
        return asyncio.run_coroutine_threadsafe(getattr(self.middleware, f"a{hook}")(*args), loop).result()

    # --- state hooks -------------------------------------------------------------------------

    def _state_hook(self, hook: str, state_json: str, native: Any) -> str | None:
        state = self.cache.values(json.loads(state_json))
        update = self._call(hook, native, state, _runtime(native))
        if update is None:
            return None
        if not isinstance(update, dict):
            raise TypeError(f"{self.name}.{hook} must return a dict of state updates or None, not {type(update).__name__}")
        return json.dumps(self._update(hook, state, update))

    def _update(self, hook: str, state: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        custom: dict[str, Any] = {}
        declared = set(self.state_keys)
        for key, value in update.items():
            if key == "messages":
                old = list(state.get("messages") or [])
                added = value if isinstance(value, list) else [value]
                new = _add_messages(old, added)
                start = 0
                while start < min(len(old), len(new)) and _same(old[start], new[start]):
                    start += 1
                if start < len(old) or start < len(new):
                    if start < len(old):
                        out["messages_from"] = start
                    out["messages"] = [_wire_with_id(m) for m in new[start:]]
            elif key == "jump_to":
                if value is not None:
                    out["jump_to"] = str(value)
            elif key == "todos":
                out["todos"] = list(value)
            elif key == "files":
                out["files"] = {path: _file(f) for path, f in dict(value).items()}
            elif key in declared or key in self.all_state_keys:
                try:
                    json.dumps(value)
                except (TypeError, ValueError) as error:
                    raise TypeError(f"{self.name}.{hook}: state key {key!r} must hold JSON data: {error}") from None
                custom[key] = value
            else:
                raise KeyError(
                    f"{self.name}.{hook} returned state key {key!r}, which no middleware declares; "
                    "add it to the middleware's state_schema"
                )
        if custom:
            out["custom"] = custom
        return out

    def before_agent(self, state_json: str, native: Any) -> str | None:
        return self._state_hook("before_agent", state_json, native)

    def before_model(self, state_json: str, native: Any) -> str | None:
        return self._state_hook("before_model", state_json, native)

    def after_model(self, state_json: str, native: Any) -> str | None:
        return self._state_hook("after_model", state_json, native)

    def after_agent(self, state_json: str, native: Any) -> str | None:
        return self._state_hook("after_agent", state_json, native)

    # --- wrapping the model call -------------------------------------------------------------

    def wrap_model_call(self, request_json: str, native: Any, handler: Callable[[str], str]) -> str:
        types = _module("langchain.agents.middleware")
        lc = _module("langchain_core.messages")
        ModelRequest, ModelResponse, AIMessage, SystemMessage = types.ModelRequest, types.ModelResponse, lc.AIMessage, lc.SystemMessage

        wire = json.loads(request_json)
        messages = [self.cache.message(m) for m in wire["messages"]]
        tools = [ToolSchema(t) for t in wire["tools"]]
        settings = wire.get("settings") or {}
        given: dict[str, Any] = {"temperature": settings.get("temperature"), "top_p": settings.get("top_p"), "max_tokens": settings.get("max_output_tokens"), "stop": settings.get("stop_sequences") or None}
        model_settings = {k: v for k, v in given.items() if v is not None}
        request = ModelRequest(
            model=self.model,
            messages=messages,
            system_message=SystemMessage(content=wire["system"]) if wire.get("system") else None,
            tools=tools,
            state=self.cache.values(wire["state"]) if "state" in wire else {"messages": messages},
            runtime=_runtime(native),
            model_settings=model_settings,
        )

        def call(request: Any) -> Any:
            if request.model is not self.model:
                return ModelResponse(result=[_call_model(request)])
            passed: dict[str, Any] = {
                "system": None if request.system_message is None else _text(request.system_message),
                "messages": [message_to_wire(m) for m in request.messages],
                "tools": [_tool_wire(t) for t in request.tools],
                "settings": {
                    "temperature": request.model_settings.get("temperature"),
                    "top_p": request.model_settings.get("top_p"),
                    "max_output_tokens": request.model_settings.get("max_tokens"),
                    "stop_sequences": list(request.model_settings.get("stop") or []),
                },
            }
            passed["settings"] = {k: v for k, v in passed["settings"].items() if v not in (None, [])}
            answer = json.loads(handler(json.dumps(passed)))
            return ModelResponse(result=[message_from_wire(answer["message"])])

        if _overrides(self.middleware, "wrap_model_call"):
            result = self.middleware.wrap_model_call(request, call)
        else:
            loop = native.event_loop or background_loop()

            async def acall(request: Any) -> Any:
                return await asyncio.get_running_loop().run_in_executor(None, call, request)

            result = asyncio.run_coroutine_threadsafe(self.middleware.awrap_model_call(request, acall), loop).result()
        inner = getattr(result, "model_response", None)
        if inner is not None:
            if getattr(result, "command", None) is not None:
                raise TypeError(f"{self.name}.wrap_model_call: a Command in ExtendedModelResponse is not supported")
            result = inner
        if isinstance(result, AIMessage):
            message = result
        else:
            answers = [m for m in getattr(result, "result", []) if isinstance(m, AIMessage)]
            if not answers:
                raise TypeError(f"{self.name}.wrap_model_call must return a ModelResponse with an AIMessage, or an AIMessage")
            message = answers[0]
        return json.dumps({"message": ai_to_wire(message, message_to_wire)})

    # --- wrapping tool calls -----------------------------------------------------------------

    def wrap_tool_call(self, call_json: str, native: Any, handler: Callable[[str], str]) -> str:
        ToolMessage = _module("langchain_core.messages").ToolMessage
        ToolCallRequest = _module("langgraph.prebuilt.tool_node").ToolCallRequest

        wire = json.loads(call_json)
        tool_call = {"name": wire["name"], "args": wire["args"], "id": wire["id"], "type": "tool_call"}
        runtime = ToolRuntime(native)
        request = ToolCallRequest(tool_call=tool_call, tool=self.tools.get(wire["name"]), state=runtime.state, runtime=runtime)
        results: list[Any] = []

        def call(request: Any) -> Any:
            answer = json.loads(handler(json.dumps({"name": request.tool_call["name"], "args": request.tool_call["args"]})))
            message = ToolMessage(content=answer["content"], tool_call_id=wire["id"], name=request.tool_call["name"], status=answer["status"])
            results.append(message)
            return message

        if _overrides(self.middleware, "wrap_tool_call"):
            result = self.middleware.wrap_tool_call(request, call)
        else:
            loop = native.event_loop or background_loop()

            async def acall(request: Any) -> Any:
                return await asyncio.get_running_loop().run_in_executor(None, call, request)

            result = asyncio.run_coroutine_threadsafe(self.middleware.awrap_tool_call(request, acall), loop).result()
        if results and result is results[-1]:
            return json.dumps({"unchanged": True})
        if not isinstance(result, ToolMessage):
            raise TypeError(f"{self.name}.wrap_tool_call must return a ToolMessage (a Command is not supported), not {type(result).__name__}")
        return json.dumps({"content": _text(result), "status": result.status})


def _wire_with_id(message: Any) -> dict[str, Any]:
    wire = message_to_wire(message)
    wire.setdefault("id", str(uuid.uuid4()))
    return wire


def _file(file: Any) -> Any:
    if file is None or isinstance(file, str):
        return file
    if isinstance(file, dict):
        content = file.get("content")
        if isinstance(content, list):
            content = "\n".join(str(line) for line in content)
        return {"content": content}
    return {"content": getattr(file, "content", None)}


def _tool_wire(tool: Any) -> Any:
    if isinstance(tool, ToolSchema):
        return tool["name"]
    if isinstance(tool, dict):
        function = tool.get("function", tool)
        return {"name": function["name"], "description": function.get("description", ""), "parameters": function.get("parameters", {"type": "object", "properties": {}})}
    schema = getattr(tool, "tool_call_schema", None) or getattr(tool, "args_schema", None)
    model_json_schema = getattr(schema, "model_json_schema", None)
    parameters = model_json_schema() if callable(model_json_schema) else (schema or {"type": "object", "properties": {}})
    return {"name": tool.name, "description": getattr(tool, "description", "") or "", "parameters": parameters}


def _call_model(request: Any) -> Any:
    """A model a hook put in the request, called directly with the request's messages."""
    model = request.model
    if isinstance(model, NativeModel):
        raise TypeError("request.model must be a LangChain chat model to be called in place of the agent's")
    tools = [t if not isinstance(t, ToolSchema) else {"type": "function", "function": dict(t)} for t in request.tools]
    if tools:
        try:
            model = model.bind_tools(tools)
        except NotImplementedError:
            pass
    messages = ([request.system_message] if request.system_message is not None else []) + list(request.messages)
    return model.invoke(messages)


def middleware_specs(middleware: Any, model: Any, tools: dict[str, Any], objects: list[Any]) -> list[dict[str, Any]]:
    """``create_deep_agent(middleware=[…])`` as the native configuration: one adapter per
    object, in order."""
    adapters = []
    for item in middleware or []:
        if isinstance(item, Message) or not any(
            callable(getattr(item, hook, None)) or callable(getattr(item, f"a{hook}", None)) for hook in _HOOKS
        ):
            raise TypeError(f"middleware must be AgentMiddleware objects (or made by @before_model, @wrap_model_call, …), not {type(item).__name__}")
        adapters.append(MiddlewareAdapter(item, model, tools))
    names = [a.name for a in adapters]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"middleware names must be unique; {', '.join(duplicates)} appears more than once (set a distinct name= or class name)")
    all_keys = sorted({key for a in adapters for key in a.state_keys})
    specs = []
    for adapter in adapters:
        adapter.all_state_keys = all_keys
        objects.append(adapter)
        specs.append({"name": adapter.name, "object": len(objects) - 1, "hooks": adapter.hooks, "state_keys": adapter.state_keys})
    return specs
