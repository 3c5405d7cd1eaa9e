"""``create_deep_agent`` and the agent it returns."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import os
import time
import uuid
from typing import Any, AsyncIterator, Iterator, Mapping, Sequence

from . import _native
from ._backends import backend_spec, permission_spec, storage_index
from ._messages import Command, message_from_wire, values_from_wire
from ._middleware import NativeModel, middleware_specs
from ._models import SUPPORTED, chat_model_spec, is_chat_model, model_name, python_model_adapter
from ._tools import background_loop, schema_of, tool_definition

_MODES = {"values": "values", "updates": "updates", "messages": "messages-tuple", "custom": "custom", "deepagents": "deepagents", "debug": "debug", "checkpoints": "checkpoints", "events": "events"}


class AgentError(RuntimeError):
    """A run failed. ``kind`` says how (``model``, ``turn_limit``, ``spend_cap``,
    ``cancelled``, ``checkpoint``, …); ``values`` is the state it reached."""

    def __init__(self, kind: str, message: str, values: Any = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.values = values


class SpendCapExceeded(AgentError):
    """The run reached ``max_cost_usd`` or ``max_tokens``."""


class InvalidRequest(AgentError, ValueError):
    """The call could not start: bad input, a resume with nothing to decide, a resume
    keyed to an interrupt that is no longer pending (re-read the state: ``get_state``), …"""


class ScriptedModel:
    """A model that replays scripted turns, for tests and offline demos: each turn has
    ``text`` and/or ``tool_calls`` (``{"name", "args"}``); ``conversations`` give subagents
    their own turns (``{"when_task_contains": …, "turns": […]}``)."""

    def __init__(self, turns: Sequence[Mapping[str, Any]] = (), *, conversations: Sequence[Mapping[str, Any]] = ()) -> None:
        self.script = {"turns": [dict(t) for t in turns], "conversations": [dict(c) for c in conversations]}


def _model_spec(model: Any, objects: list[Any]) -> Any:
    if model is None:
        return "anthropic:claude-sonnet-4-5"
    if isinstance(model, str):
        return model
    if isinstance(model, ScriptedModel):
        return {"script": model.script}
    spec = chat_model_spec(model)
    if spec is not None:
        return spec
    if is_chat_model(model):
        objects.append(python_model_adapter(model))
        return {"python": len(objects) - 1, "id": model_name(model)}
    raise TypeError(
        "model must be a 'provider:model' string (openai:…, anthropic:…, google_genai:…, ollama:…, scripted:PATH …), "
        f"a LangChain chat model (settings read from {', '.join(SUPPORTED)}; others are called through Python) "
        f"or a ScriptedModel, not {type(model).__name__}"
    )


def _interrupts(config: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tool, value in (config or {}).items():
        if isinstance(value, bool):
            out[tool] = value
        elif isinstance(value, Mapping):
            description = value.get("description")
            if description is not None and not isinstance(description, str):
                raise TypeError(f"interrupt_on[{tool!r}]['description'] must be a string")
            out[tool] = {"allowed_decisions": value.get("allowed_decisions"), "description": description}
        else:
            raise TypeError(f"interrupt_on[{tool!r}] must be True, False or a dict")
    return out


def _unwrapped_format(response_format: Any) -> Any:
    """The schema inside LangChain's ``ToolStrategy``/``ProviderStrategy`` wrappers."""
    inner = getattr(response_format, "schema", None)
    if inner is not None and not isinstance(response_format, (Mapping, type)):
        return inner
    return response_format


# The harness's own tools: always there, so a subagent that names them needs nothing more.
_BUILT_IN_TOOLS = {"ls", "read_file", "write_file", "edit_file", "delete", "glob", "grep", "execute", "write_todos", "task"}


def _subagent_tools(name: str, tools: Sequence[Any], parent: Mapping[str, dict[str, Any]], objects: list[Any]) -> list[dict[str, Any]]:
    """A subagent's tools: functions, or names of the parent's tools."""
    out = []
    for tool in tools:
        if isinstance(tool, str):
            if tool in parent:
                out.append(parent[tool])
            elif tool not in _BUILT_IN_TOOLS:
                raise ValueError(f"subagent {name!r} names tool {tool!r}, which the agent does not have; known: {sorted(parent)}")
        else:
            out.extend(_tools([tool], objects))
    return out


def _is_async(sub: Mapping[str, Any]) -> bool:
    """``"async": True``: the subagent runs in the background (``start_async_task``)."""
    value = sub.get("async", False)
    if not isinstance(value, bool):
        raise TypeError(f"subagent {sub.get('name')!r}: 'async' must be True or False, not {value!r}")
    return value


# The keys the Agent Protocol SDK reads an API key from, in its order.
_API_KEY_VARIABLES = ("LANGGRAPH_API_KEY", "LANGSMITH_API_KEY", "LANGCHAIN_API_KEY")


def _remote_subagent(sub: Mapping[str, Any]) -> dict[str, Any]:
    """The reference's ``AsyncSubAgent`` (``name``, ``description``, ``graph_id``, ``url``,
    ``headers``) as a remote agent of the harness."""
    name = sub.get("name")
    missing = [k for k in ("name", "description", "graph_id") if not sub.get(k)]
    if missing:
        raise ValueError(f"an async subagent needs {' and '.join(missing)}: {dict(sub)!r}")
    url = sub.get("url")
    if not url:
        # Without a url the reference reaches a graph of its own LangGraph server in-process,
        # which only exists inside that server.
        raise ValueError(f"async subagent {name!r} needs a url: the Agent Protocol server that runs graph {sub['graph_id']!r}")
    if sub.get("mode", "isolated") != "isolated":
        raise ValueError(f"async subagent {name!r}: mode={sub['mode']!r} is not supported; remote subagents get the task description only")
    if sub.get("update_strategy", "interrupt") != "interrupt":
        raise ValueError(f"async subagent {name!r}: update_strategy={sub['update_strategy']!r} is not supported; an update interrupts the running task")
    if sub.get("webhook") is not None:
        raise ValueError(f"async subagent {name!r}: webhook= is not supported; its ending is delivered to this agent's thread")
    if sub.get("notify_parent", True) is not True:
        raise ValueError(f"async subagent {name!r}: notify_parent=False is not supported; its ending is always delivered to this agent's thread")
    headers = {str(k): str(v) for k, v in (sub.get("headers") or {}).items()}
    lower = {k.lower() for k in headers}
    # What the reference and its SDK send unless told otherwise.
    if "x-auth-scheme" not in lower:
        headers["x-auth-scheme"] = "langsmith"
    if "x-api-key" not in lower:
        key = next((os.environ[v].strip().strip('"').strip("'") for v in _API_KEY_VARIABLES if os.environ.get(v)), None)
        if key:
            headers["x-api-key"] = key
    return {"name": name, "description": sub["description"], "url": str(url), "graph_id": str(sub["graph_id"]), "headers": headers}


def _response_schema(response_format: Any) -> Any:
    response_format = _unwrapped_format(response_format)
    if response_format is None:
        return None
    if isinstance(response_format, Mapping):
        return dict(response_format)
    schema = schema_of(response_format)
    if not schema:
        raise TypeError("response_format must be a Pydantic model, a dataclass, a TypedDict or a JSON schema dict")
    return schema


def _tools(tools: Sequence[Any] | None, objects: list[Any]) -> list[dict[str, Any]]:
    out = []
    for tool in tools or []:
        definition = tool_definition(tool)
        objects.append(definition.adapter)
        out.append({"name": definition.name, "description": definition.description, "parameters": definition.parameters, "object": len(objects) - 1, "mutating": definition.mutating})
    return out


def create_deep_agent(
    model: Any = None,
    tools: Sequence[Any] | None = None,
    *,
    system_prompt: str | None = None,
    subagents: Sequence[Mapping[str, Any]] | None = None,
    skills: Sequence[str] | None = None,
    memory: Sequence[str] | None = None,
    backend: Any = None,
    interrupt_on: Mapping[str, Any] | None = None,
    permissions: Sequence[Any] | None = None,
    response_format: Any = None,
    checkpointer: Any = None,
    store: Any = None,
    name: str | None = None,
    todos: bool | None = None,
    max_turns: int | None = None,
    max_cost_usd: float | None = None,
    max_tokens: int | None = None,
    general_purpose_subagent: bool | None = None,
    ask_user: bool = False,
    middleware: Sequence[Any] = (),
) -> "DeepAgent":
    """A deep agent on the Rust harness. ``model`` is a ``provider:model`` spec (as the CLI
    takes), a LangChain chat model object (``ChatOpenAI``, ``ChatAnthropic``,
    ``ChatGoogleGenerativeAI``, ``ChatOllama``: its settings are read and the harness's own
    client is built with them) or a :class:`ScriptedModel`; ``tools`` are plain or async functions (their schema
    comes from type hints and the docstring); ``subagents`` are dicts with ``name``,
    ``description``, ``system_prompt`` and optional ``tools``, ``model``, ``interrupt_on``,
    ``skills``, ``permissions``, ``response_format``, ``mode`` (``"isolated"``, the default, or
    ``"fork"``: the subagent continues this agent's conversation), ``async`` (``True``: started
    in the background with ``start_async_task``), or the reference's ``AsyncSubAgent`` specs
    (``graph_id`` and ``url`` of an Agent Protocol server). ``max_cost_usd`` and ``max_tokens``
    are hard caps on what a run (with its subagents) spends. ``ask_user=True`` offers the
    ``ask_user`` tool: the model's question pauses the run as an interrupt whose value is
    ``{"question": …, "options": […]}``, and ``Command(resume=answer)`` is the call's result. ``middleware`` are LangChain
    ``AgentMiddleware`` objects, run after the built-in ones (see ``_middleware`` for what
    their hooks may do)."""
    objects: list[Any] = []
    middleware_tools = [t for m in middleware for t in (getattr(m, "tools", None) or [])]
    all_tools = [*(tools or []), *middleware_tools]
    parent_tools = _tools(all_tools, objects)
    tool_objects = {str(t.name): t for t in all_tools if hasattr(t, "name") and hasattr(t, "invoke")}
    by_name = {t["name"]: t for t in parent_tools}
    subagent_specs = []
    remote_specs = []
    for sub in subagents or []:
        if "graph_id" in sub:
            # The reference tells its AsyncSubAgent specs apart by `graph_id`.
            remote_specs.append(_remote_subagent(sub))
            continue
        if sub.get("middleware"):
            raise TypeError(f"subagent {sub.get('name')!r}: middleware on subagents is not supported; pass it to create_deep_agent for the main agent")
        if "runnable" in sub or "graph" in sub:
            raise TypeError(f"subagent {sub.get('name')!r}: compiled subagents (runnable=…) are not supported; describe it with system_prompt, tools and model")
        missing = [k for k in ("name", "description") if not sub.get(k)]
        if missing:
            raise ValueError(f"a subagent needs {' and '.join(missing)}: {dict(sub)!r}")
        subagent_specs.append(
            {
                "name": sub["name"],
                "description": sub["description"],
                "system_prompt": sub.get("system_prompt") or sub.get("prompt") or "",
                "tools": None if sub.get("tools") is None else _subagent_tools(sub["name"], sub["tools"], by_name, objects),
                "model": None if sub.get("model") is None else _model_spec(sub["model"], objects),
                "interrupt_on": None if sub.get("interrupt_on") is None else _interrupts(sub["interrupt_on"]),
                "skills": list(sub.get("skills") or []),
                "permissions": None if sub.get("permissions") is None else [permission_spec(r) for r in sub["permissions"]],
                "response_format": _response_schema(sub.get("response_format")),
                "mode": sub.get("mode"),
                "asynchronous": _is_async(sub),
            }
        )
    model_spec = _model_spec(model, objects)
    spend = None
    if max_cost_usd is not None or max_tokens is not None:
        spend = {"max_cost_usd": max_cost_usd, "max_tokens": max_tokens}
    config = {
        "model": model_spec,
        "name": name,
        "system_prompt": system_prompt,
        "tools": parent_tools,
        "subagents": subagent_specs,
        "remote_subagents": remote_specs,
        "general_purpose_subagent": general_purpose_subagent,
        "skills": list(skills or []),
        "memory": list(memory or []),
        "backend": None if backend is None else backend_spec(backend, objects),
        "interrupt_on": _interrupts(interrupt_on),
        "permissions": [permission_spec(r) for r in permissions or []],
        "response_format": _response_schema(response_format),
        "checkpointer": storage_index(checkpointer, "checkpointer", objects),
        "store": storage_index(store, "store", objects),
        "todos": todos,
        "ask_user": ask_user,
        # The reference's recursion limit of 1000 graph steps allows about 500 model calls.
        "max_turns": 500 if max_turns is None else max_turns,
        "spend_limits": spend,
        "middleware": middleware_specs(middleware, model if model is not None and not isinstance(model, str) else NativeModel(str(model_spec)), tool_objects, objects),
    }
    native = _native.NativeAgent(json.dumps(config), objects)
    return DeepAgent(native, _unwrapped_format(response_format))


@dataclasses.dataclass(frozen=True)
class StateSnapshot:
    """A thread's state: ``values`` (messages, todos, files, …), ``next`` (``("tools",)``
    while approvals wait), ``interrupts``, and the ``config`` naming the thread."""

    values: dict[str, Any]
    next: tuple[str, ...]
    config: dict[str, Any]
    interrupts: tuple[Any, ...] = ()


@dataclasses.dataclass(frozen=True)
class GraphOutput:
    """What ``invoke(…, version="v2")`` returns, as LangGraph's: the state as ``value``
    and the pending approvals as ``interrupts``."""

    value: Any
    interrupts: tuple[Any, ...] = ()

    def __getitem__(self, key: str) -> Any:
        """``result["messages"]``, ``result["__interrupt__"]``: the v1 way, still read."""
        if key == "__interrupt__":
            return self.interrupts
        return self.value[key]

    def __contains__(self, key: object) -> bool:
        return bool(self.interrupts) if key == "__interrupt__" else key in self.value


def _graph_output(values: dict[str, Any]) -> GraphOutput:
    values = dict(values)
    return GraphOutput(value=values, interrupts=tuple(values.pop("__interrupt__", None) or ()))


def _version(version: str) -> bool:
    """Whether ``version`` asks for LangGraph's v2 output (typed stream parts, GraphOutput)."""
    if version not in ("v1", "v2"):
        raise ValueError(f"version must be 'v1' or 'v2', not {version!r}")
    return version == "v2"


# How long one native wait lasts: Python sees Ctrl-C and cancellation between waits.
_WAIT_SLICE = 0.25


def _slice(deadline: float | None) -> float:
    """The next native wait: a slice, or what is left before ``deadline``."""
    if deadline is None:
        return _WAIT_SLICE
    return max(0.0, min(_WAIT_SLICE, deadline - time.monotonic()))


def _thread_id(config: Mapping[str, Any] | None) -> str | None:
    if not config:
        return None
    configurable = config.get("configurable") or {}
    thread_id = configurable.get("thread_id")
    return None if thread_id is None else str(thread_id)


class DeepAgent:
    """An agent made by :func:`create_deep_agent`: ``invoke``/``stream`` and their async
    twins, ``get_state``, and waiting for async subagents (``wait_for_background``)."""

    def __init__(self, native: Any, response_format: Any) -> None:
        self._native = native
        self._response_format = response_format

    @property
    def name(self) -> str:
        return str(self._native.name)

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools the model is offered (name, description, parameters)."""
        return list(json.loads(self._native.tools_json()))

    def _start(self, input: Any, config: Mapping[str, Any] | None, modes: Sequence[str], subgraphs: bool, context: Any, loop: Any) -> Any:
        from ._messages import input_to_wire

        resume = None
        if not isinstance(input, Command) and type(input).__name__ == "Command" and hasattr(input, "resume"):
            # LangGraph's own Command, passed out of habit: the same thing here.
            input = Command(resume=input.resume, update=getattr(input, "update", None), goto=getattr(input, "goto", None) or None)
        if isinstance(input, Command):
            if input.goto is not None:
                raise ValueError("Command(goto=…) is not supported: the agent is one loop")
            if input.resume is None:
                raise ValueError("Command needs resume=…: the decisions for the pending actions")
            resume = json.dumps(input.resume, default=str)
            wire = None
        else:
            wire = input_to_wire(input)
        native_modes = []
        for mode in modes:
            if mode not in _MODES:
                raise ValueError(f"unknown stream_mode {mode!r}; use one of {sorted(_MODES)}")
            native_modes.append(_MODES[mode])
        max_turns = None
        limit = (config or {}).get("recursion_limit")
        if limit is not None:
            # LangGraph counts graph steps: a model call and its tools are two.
            max_turns = max(1, int(limit) // 2)
        return self._native.start(json.dumps(wire), _thread_id(config), resume, native_modes, subgraphs, context, loop, max_turns)

    def _result(self, end: dict[str, Any]) -> dict[str, Any]:
        values: dict[str, Any] = values_from_wire(end.get("values") or {})
        structured = values.get("structured_response")
        if structured is not None and hasattr(self._response_format, "model_validate"):
            values["structured_response"] = self._response_format.model_validate(structured)
        return values

    def _outputs(self, frame: tuple[str, str], modes: Sequence[str], single: bool, subgraphs: bool, v2: bool = False) -> tuple[bool, Any]:
        name, data = frame
        payload = json.loads(data)
        if name == "__end__":
            return True, payload
        if name == "__error__":
            kind = payload.get("kind") or "error"
            message = payload.get("message") or "the run failed"
            values = values_from_wire(payload.get("values"))
            if kind == "spend_cap":
                raise SpendCapExceeded(kind, message, values)
            if kind in ("invalid", "invalid_decision"):
                raise InvalidRequest(kind, message, values)
            raise AgentError(kind, message, values)
        mode, *namespace = name.split("|")
        mode = {"messages-tuple": "messages"}.get(mode, mode)
        if mode == "messages":
            chunk, meta = payload
            payload = (message_from_wire(chunk), meta)
        elif mode == "values":
            payload = values_from_wire(payload)
        elif mode == "updates":
            payload = {node: values_from_wire(update) if node != "__interrupt__" else values_from_wire({"__interrupt__": update})["__interrupt__"] for node, update in payload.items()}
        elif mode == "events" and isinstance(payload.get("data"), dict) and isinstance(payload["data"].get("chunk"), dict):
            payload["data"]["chunk"] = message_from_wire(payload["data"]["chunk"])
        ns = tuple(namespace)
        if v2:
            if mode == "values" and isinstance(payload, dict):
                interrupts = tuple(payload.pop("__interrupt__", None) or ())
                return False, {"type": mode, "ns": ns, "data": payload, "interrupts": interrupts}
            return False, {"type": mode, "ns": ns, "data": payload}
        if single:
            out: Any = (ns, payload) if subgraphs else payload
        else:
            out = (ns, mode, payload) if subgraphs else (mode, payload)
        return False, out

    def invoke(self, input: Any, config: Mapping[str, Any] | None = None, *, context: Any = None, version: str = "v1") -> Any:
        """Runs until the answer or a pause. Returns the state: ``messages``, ``files``,
        ``todos``, ``structured_response`` when asked for, ``__interrupt__`` when paused;
        with ``version="v2"``, a :class:`GraphOutput` (``value``, ``interrupts``)."""
        v2 = _version(version)
        stream = self._start(input, config, [], False, context, background_loop())
        for frame in stream:
            done, value = self._outputs(frame, [], True, False)
            if done:
                result = self._result(value)
                return _graph_output(result) if v2 else result
        raise AgentError("crashed", "the run ended without a result")

    def stream(
        self,
        input: Any,
        config: Mapping[str, Any] | None = None,
        *,
        stream_mode: str | Sequence[str] = "values",
        subgraphs: bool = False,
        context: Any = None,
        version: str = "v1",
    ) -> Iterator[Any]:
        """Yields what each ``stream_mode`` produces: ``values`` (the state after each step),
        ``updates`` (``{node: changes}``), ``messages`` (``(chunk, metadata)`` as tokens
        arrive), ``deepagents`` (the harness's events). Several modes yield ``(mode, chunk)``;
        ``subgraphs=True`` adds the namespace (subagents' chunks come with theirs).
        ``version="v2"`` yields LangGraph's stream parts instead: ``{"type": mode, "ns":
        namespace, "data": chunk}`` (``values`` parts with ``interrupts``)."""
        v2 = _version(version)
        single = isinstance(stream_mode, str)
        modes = [stream_mode] if isinstance(stream_mode, str) else list(stream_mode)
        native = self._start(input, config, modes, subgraphs, context, background_loop())
        try:
            for frame in native:
                done, value = self._outputs(frame, modes, single, subgraphs, v2)
                if done:
                    return
                yield value
        finally:
            native.cancel()

    def batch(self, inputs: Sequence[Any], config: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None, *, context: Any = None) -> list[dict[str, Any]]:
        """:meth:`invoke` for each input, concurrently (one config for all, or one each)."""
        configs = _configs(config, len(inputs))
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(inputs)))) as pool:
            return list(pool.map(lambda pair: self.invoke(pair[0], pair[1], context=context), zip(inputs, configs)))

    async def abatch(self, inputs: Sequence[Any], config: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None, *, context: Any = None) -> list[dict[str, Any]]:
        """:meth:`ainvoke` for each input, concurrently."""
        configs = _configs(config, len(inputs))
        return list(await asyncio.gather(*(self.ainvoke(i, c, context=context) for i, c in zip(inputs, configs))))

    async def ainvoke(self, input: Any, config: Mapping[str, Any] | None = None, *, context: Any = None, version: str = "v1") -> Any:
        """:meth:`invoke` without blocking the event loop; async tools run on this loop."""
        v2 = _version(version)
        loop = asyncio.get_running_loop()
        native = self._start(input, config, [], False, context, loop)
        try:
            while True:
                frame = await loop.run_in_executor(None, _next, native)
                if frame is None:
                    raise AgentError("crashed", "the run ended without a result")
                done, value = self._outputs(frame, [], True, False)
                if done:
                    result = self._result(value)
                    return _graph_output(result) if v2 else result
        finally:
            native.cancel()

    async def astream(
        self,
        input: Any,
        config: Mapping[str, Any] | None = None,
        *,
        stream_mode: str | Sequence[str] = "values",
        subgraphs: bool = False,
        context: Any = None,
        version: str = "v1",
    ) -> AsyncIterator[Any]:
        """:meth:`stream` as an async iterator; async tools run on this loop."""
        v2 = _version(version)
        loop = asyncio.get_running_loop()
        single = isinstance(stream_mode, str)
        modes = [stream_mode] if isinstance(stream_mode, str) else list(stream_mode)
        native = self._start(input, config, modes, subgraphs, context, loop)
        try:
            while True:
                frame = await loop.run_in_executor(None, _next, native)
                if frame is None:
                    return
                done, value = self._outputs(frame, modes, single, subgraphs, v2)
                if done:
                    return
                yield value
        finally:
            native.cancel()

    def stream_events(self, input: Any, config: Mapping[str, Any] | None = None, *, version: str = "v2", context: Any = None) -> Iterator[dict[str, Any]]:
        """LangChain's event stream (``version="v1"`` or ``"v2"``, the same events here):
        ``on_chain_start`` with the input, ``on_chat_model_stream`` with each
        ``AIMessageChunk`` (``data["chunk"]``), ``on_tool_start``/``on_tool_end``, subagents'
        events too, and ``on_chain_end`` with the final state as ``data["output"]``."""
        events = _Events(self.name, input, version)
        yield events.start()
        for part in self.stream(input, config, stream_mode=["events", "values"], subgraphs=True, context=context, version="v2"):
            event = events.of(part)
            if event is not None:
                yield event
        yield events.end()

    async def astream_events(self, input: Any, config: Mapping[str, Any] | None = None, *, version: str = "v2", context: Any = None) -> AsyncIterator[dict[str, Any]]:
        """:meth:`stream_events` as an async iterator; async tools run on this loop."""
        events = _Events(self.name, input, version)
        yield events.start()
        async for part in self.astream(input, config, stream_mode=["events", "values"], subgraphs=True, context=context, version="v2"):
            event = events.of(part)
            if event is not None:
                yield event
        yield events.end()

    def get_state(self, config: Mapping[str, Any]) -> StateSnapshot:
        """The thread's latest state (empty values for a thread that has none)."""
        thread_id = self._require_thread(config, "get_state")
        checkpoint = (config.get("configurable") or {}).get("checkpoint_id")
        at = None if checkpoint is None else int(checkpoint)
        values = values_from_wire(json.loads(self._native.state_json(thread_id, at)) or {})
        interrupts = tuple(values.get("__interrupt__") or ())
        return StateSnapshot(values=values, next=("tools",) if interrupts else (), config={"configurable": {"thread_id": thread_id}}, interrupts=interrupts)


    def get_state_history(self, config: Mapping[str, Any], *, limit: int | None = None) -> Iterator[StateSnapshot]:
        """The thread's states, newest first, one per checkpoint; each snapshot's ``config``
        carries its ``checkpoint_id``."""
        thread_id = self._require_thread(config, "get_state_history")
        checkpoints = json.loads(self._native.history_json(thread_id))
        for count, info in enumerate(reversed(checkpoints)):
            if limit is not None and count >= limit:
                return
            checkpoint = info.get("id")
            values = values_from_wire(json.loads(self._native.state_json(thread_id, checkpoint)) or {})
            interrupts = tuple(values.get("__interrupt__") or ())
            yield StateSnapshot(
                values=values,
                next=("tools",) if interrupts else (),
                config={"configurable": {"thread_id": thread_id, "checkpoint_id": str(checkpoint)}},
                interrupts=interrupts,
            )

    def update_state(self, config: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
        """Changes the thread's state as a checkpoint of its own: ``messages`` are added (one
        with the ``id`` of a message of the thread replaces it), ``todos`` replaced,
        ``files`` written (``None`` deletes). Returns the new checkpoint's config."""
        from ._messages import message_to_wire

        thread_id = self._require_thread(config, "update_state")
        wire = dict(values)
        if "messages" in wire:
            messages = wire["messages"]
            if not isinstance(messages, (list, tuple)):
                messages = [messages]
            wire["messages"] = [message_to_wire(m) for m in messages]
        checkpoint = self._native.update_state_json(thread_id, json.dumps(wire, default=str))
        return {"configurable": {"thread_id": thread_id, "checkpoint_id": str(checkpoint)}}

    def background_running(self, config: Mapping[str, Any]) -> int:
        """How many async subagent tasks the thread started run now in this process."""
        return int(self._native.background_running(self._require_thread(config, "background_running")))

    def wait_for_background(self, config: Mapping[str, Any], *, timeout: float | None = None) -> list[dict[str, Any]]:
        """Waits until async subagents the thread started have ended, and returns their
        endings (``task_id``, ``subagent``, ``status``, ``answer``) without delivering them;
        ``[]`` when none runs and none waits for delivery. ``agent.invoke(None, config)`` then
        runs the turn they start (the model answers them); the thread's next ``invoke`` with
        input takes them too. Raises ``TimeoutError`` after ``timeout`` seconds."""
        thread_id = self._require_thread(config, "wait_for_background")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            endings = self._native.next_wake_json(thread_id, _slice(deadline))
            if endings is not None:
                return list(json.loads(endings))
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"async subagents of thread {thread_id!r} still run after {timeout} s")

    async def await_background(self, config: Mapping[str, Any], *, timeout: float | None = None) -> list[dict[str, Any]]:
        """:meth:`wait_for_background` without blocking the event loop."""
        thread_id = self._require_thread(config, "await_background")
        deadline = None if timeout is None else time.monotonic() + timeout
        loop = asyncio.get_running_loop()
        while True:
            # Short slices, so a cancelled task leaves no executor thread waiting long.
            endings = await loop.run_in_executor(None, self._native.next_wake_json, thread_id, _slice(deadline))
            if endings is not None:
                return list(json.loads(endings))
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"async subagents of thread {thread_id!r} still run after {timeout} s")

    def _require_thread(self, config: Mapping[str, Any], what: str) -> str:
        thread_id = _thread_id(config)
        if thread_id is None:
            raise ValueError(f"{what} needs config={{'configurable': {{'thread_id': …}}}}")
        return thread_id


def _configs(config: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None, count: int) -> list[Mapping[str, Any] | None]:
    if config is None or isinstance(config, Mapping):
        return [config] * count
    configs: list[Mapping[str, Any] | None] = list(config)
    if len(configs) != count:
        raise ValueError(f"{len(configs)} configs for {count} inputs; give one config or one per input")
    return configs


def _next(native: Any) -> Any:
    return next(native, None)


class _Events:
    """Stream parts of the ``events`` and ``values`` modes as LangChain's ``StreamEvent``
    dicts (``event``, ``name``, ``run_id``, ``parent_ids``, ``tags``, ``metadata``,
    ``data``), between the root run's start and end."""

    def __init__(self, name: str, input: Any, version: str) -> None:
        if version not in ("v1", "v2"):
            raise ValueError(f"stream_events takes version 'v1' or 'v2', not {version!r}")
        self.name = name
        self.input = input
        self.run_id = str(uuid.uuid4())
        self.output: Any = None

    def start(self) -> dict[str, Any]:
        return {"event": "on_chain_start", "name": self.name, "run_id": self.run_id, "parent_ids": [], "tags": [], "metadata": {}, "data": {"input": self.input}}

    def of(self, part: dict[str, Any]) -> dict[str, Any] | None:
        if part["type"] == "values":
            if not part["ns"]:
                self.output = dict(part["data"])
                if part["interrupts"]:
                    self.output["__interrupt__"] = list(part["interrupts"])
            return None
        event = dict(part["data"])
        event.setdefault("run_id", self.run_id)
        event.setdefault("tags", [])
        event.setdefault("metadata", {})
        event["parent_ids"] = [self.run_id]
        if part["ns"]:
            event["metadata"] = dict(event["metadata"], checkpoint_ns="|".join(part["ns"]))
        return event

    def end(self) -> dict[str, Any]:
        return {"event": "on_chain_end", "name": self.name, "run_id": self.run_id, "parent_ids": [], "tags": [], "metadata": {}, "data": {"input": self.input, "output": self.output}}
