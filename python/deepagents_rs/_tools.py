"""Python functions as tools: a JSON schema from type hints and the docstring, and the
adapter the native side calls (arguments in as JSON, a JSON answer out, exceptions turned
into error results the model sees)."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import enum
import importlib
import inspect
import json
import re
import threading
import types
import typing
from typing import Any, Callable, Literal, Union, get_args, get_origin

from ._messages import ToolRuntime

_INJECTED = {"runtime"}


def _is_runtime(name: str, annotation: Any) -> bool:
    return name in _INJECTED or annotation is ToolRuntime


def _pydantic_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and hasattr(annotation, "model_json_schema")


def schema_of(annotation: Any) -> dict[str, Any]:
    """The JSON schema of a type hint (the subset models use for tool arguments)."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    origin = get_origin(annotation)
    args = get_args(annotation)
    schema: dict[str, Any]
    if origin is typing.Annotated:
        schema = schema_of(args[0])
        notes = [a for a in args[1:] if isinstance(a, str)]
        if notes:
            schema["description"] = " ".join(notes)
        return schema
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return schema_of(options[0])
        return {"anyOf": [schema_of(a) for a in options]}
    if origin is Literal:
        values = list(args)
        schema = {"enum": values}
        kinds = {type(v) for v in values}
        if len(kinds) == 1:
            schema.update(schema_of(kinds.pop()))
        return schema
    if origin in (list, tuple, set, frozenset, typing.Sequence) or annotation in (list, tuple, set):
        schema = {"type": "array"}
        if args and args[0] is not Ellipsis:
            schema["items"] = schema_of(args[0])
        return schema
    if origin is dict or annotation is dict:
        schema = {"type": "object"}
        if len(args) == 2:
            schema["additionalProperties"] = schema_of(args[1])
        return schema
    if annotation is str:
        return {"type": "string"}
    if annotation is bool:
        return {"type": "boolean"}
    if annotation is int:
        return {"type": "integer"}
    if annotation is float:
        return {"type": "number"}
    if annotation is type(None):
        return {"type": "null"}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"enum": [member.value for member in annotation]}
    if _pydantic_model(annotation):
        return _inline_defs(annotation.model_json_schema())
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        hints = typing.get_type_hints(annotation, include_extras=True)
        properties = {}
        required = []
        for field in dataclasses.fields(annotation):
            properties[field.name] = schema_of(hints.get(field.name, Any))
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                required.append(field.name)
        return {"type": "object", "properties": properties, "required": required}
    if isinstance(annotation, type) and typing.is_typeddict(annotation):
        hints = typing.get_type_hints(annotation, include_extras=True)
        required_keys = getattr(annotation, "__required_keys__", set(hints))
        return {
            "type": "object",
            "properties": {k: schema_of(v) for k, v in hints.items()},
            "required": [k for k in hints if k in required_keys],
        }
    return {}


def _inline_defs(schema: dict[str, Any]) -> dict[str, Any]:
    """Pydantic's `$defs` inlined: some providers refuse references in tool schemas."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk(dict(defs.get(ref.split("/")[-1], {})))
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    inlined: dict[str, Any] = walk(schema)
    return inlined


def _docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The first paragraph, and the parameters' descriptions (Google or Sphinx style)."""
    doc = inspect.getdoc(fn) or ""
    paragraphs = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)
    summary = " ".join(paragraphs[0].split()) if paragraphs and paragraphs[0] else ""
    if re.match(r"^(Args|Arguments|Parameters|Returns|Raises):", summary):
        summary = ""
    params: dict[str, str] = {}
    section = False
    current = None
    for line in doc.splitlines():
        stripped = line.strip()
        sphinx = re.match(r":param\s+(\w+):\s*(.*)", stripped)
        if sphinx:
            params[sphinx.group(1)] = sphinx.group(2)
            continue
        if re.match(r"^(Args|Arguments|Parameters):\s*$", stripped):
            section = True
            continue
        if section:
            if re.match(r"^(Returns|Raises|Yields|Examples?|Notes?):", stripped):
                section = False
                continue
            entry = re.match(r"(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", stripped)
            if entry and line.startswith((" ", "\t")) and len(line) - len(line.lstrip()) <= 8:
                current = entry.group(1)
                params[current] = entry.group(2)
            elif stripped and current:
                params[current] = (params[current] + " " + stripped).strip()
    return summary, params


@dataclasses.dataclass
class ToolDefinition:
    """A tool as the native side takes it."""

    name: str
    description: str
    parameters: dict[str, Any]
    adapter: Callable[[str, Any], str]
    mutating: bool = False


_MUTATING = "__deepagents_mutating__"

_T = typing.TypeVar("_T")


def mutating(tool: _T) -> _T:
    """Marks a tool (a function or a LangChain tool) as one that changes something outside
    the agent — files, services, money. A call of it in flight when the process dies is
    reported to the model as interrupted when the thread resumes, never run again; other
    tools are read-only and run again."""
    try:
        setattr(tool, _MUTATING, True)
    except (AttributeError, TypeError, ValueError):
        # Models that refuse new attributes (a LangChain tool is a Pydantic model).
        object.__setattr__(tool, _MUTATING, True)
    return tool


def _is_mutating(tool: Any) -> bool:
    return bool(getattr(tool, _MUTATING, False))


def _json_default(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def _content(result: Any) -> str:
    if result is None:
        return ""
    if isinstance(result, str):
        return result
    content = getattr(result, "content", None)
    if isinstance(content, str):
        return content
    try:
        return json.dumps(result, default=_json_default)
    except (TypeError, ValueError):
        return str(result)


class _BackgroundLoop:
    """The event loop async tools run on when the caller has none (`invoke`, `stream`)."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="deepagents-rs-tools", daemon=True
                )
                thread.start()
                cls._loop = loop
            return cls._loop


def background_loop() -> asyncio.AbstractEventLoop:
    return _BackgroundLoop.get()


class _Suspend(Exception):
    """Raised by ``interrupt()`` for a question not answered yet: the call stops and the run
    pauses on it."""

    def __init__(self, value: Any) -> None:
        super().__init__("interrupt() outside a tool call of a deepagents_rs agent")
        self.value = value


class _Asked:
    """The answers a tool call got to its earlier ``interrupt()`` calls (LangGraph's resume
    values, in order), and how many it asked this time."""

    def __init__(self, answers: list[Any]) -> None:
        self.resume = answers
        self.asked = 0

    def interrupt_counter(self) -> int:
        self.asked += 1
        return self.asked - 1

    def get_null_resume(self, consume: bool = False) -> Any:
        return None


_ASKED: contextvars.ContextVar[_Asked | None] = contextvars.ContextVar("deepagents_rs_asked", default=None)


def interrupt(value: Any) -> Any:
    """Asks the person running the agent ``value`` (a question, a form: JSON) from inside a
    tool, as LangGraph's ``interrupt`` does: the run pauses on it, and once answered
    (``Command(resume=answer)``) the tool runs again and this call returns the answer.
    ``langgraph.types.interrupt`` works the same in this package's tools."""
    asked = _ASKED.get()
    if asked is None:
        raise RuntimeError("interrupt() is for the tools of a deepagents_rs agent, called while the agent runs them")
    index = asked.interrupt_counter()
    if index < len(asked.resume):
        return asked.resume[index]
    raise _Suspend(value)


def _answers(native_call: Any) -> list[Any]:
    answers = getattr(native_call, "answers_json", None)
    if answers is None:
        return []
    return [a.get("given") for a in json.loads(answers())]


def _langgraph_config(asked: _Asked) -> Any:
    """A runnable config under which LangGraph's own ``interrupt`` reads ``asked``: the
    resume values so far, and a question beyond them raises ``GraphInterrupt``."""
    try:
        constants = importlib.import_module("langgraph._internal._constants")
        runnable_config = importlib.import_module("langchain_core.runnables.config")
    except ImportError:
        return None
    config = {
        "configurable": {
            constants.CONFIG_KEY_SCRATCHPAD: asked,
            constants.CONFIG_KEY_SEND: lambda writes: None,
            constants.CONFIG_KEY_CHECKPOINT_NS: "deepagents_rs",
        }
    }
    return runnable_config.var_child_runnable_config, config


def _suspended(error: BaseException) -> Any:
    """The value a tool asked, when ``error`` is its ``interrupt()``; ``_MISSING`` otherwise."""
    if isinstance(error, _Suspend):
        return error.value
    if type(error).__name__ in ("GraphInterrupt", "NodeInterrupt") and error.args:
        first = error.args[0]
        if isinstance(first, (list, tuple)) and first:
            return getattr(first[0], "value", first[0])
    return _MISSING


_MISSING = object()


def _with_asked(asked: _Asked, run: Callable[[], Any]) -> Any:
    token = _ASKED.set(asked)
    langgraph = _langgraph_config(asked)
    lg_token = langgraph[0].set(langgraph[1]) if langgraph else None
    try:
        return run()
    finally:
        if langgraph and lg_token is not None:
            langgraph[0].reset(lg_token)
        _ASKED.reset(token)


async def _awaited_with(asked: _Asked, awaitable: Any) -> Any:
    token = _ASKED.set(asked)
    langgraph = _langgraph_config(asked)
    lg_token = langgraph[0].set(langgraph[1]) if langgraph else None
    try:
        return await awaitable
    finally:
        if langgraph and lg_token is not None:
            langgraph[0].reset(lg_token)
        _ASKED.reset(token)


def _adapter(
    name: str,
    call: Callable[..., Any],
    is_async: bool,
    runtime_param: str | None,
    convert: dict[str, Any],
) -> Callable[[str, Any], str]:
    def adapter(args_json: str, native_call: Any) -> str:
        try:
            args = json.loads(args_json)
            if not isinstance(args, dict):
                raise TypeError("the arguments must be an object")
            for key, model in convert.items():
                if key in args and isinstance(args[key], dict):
                    args[key] = model.model_validate(args[key])
            if runtime_param is not None:
                args[runtime_param] = ToolRuntime(native_call)
            asked = _Asked(_answers(native_call))
            if is_async:
                loop = native_call.event_loop or background_loop()
                result = asyncio.run_coroutine_threadsafe(_awaited_with(asked, call(**args)), loop).result()
            else:
                result = _with_asked(asked, lambda: call(**args))
            if inspect.isawaitable(result):
                loop = native_call.event_loop or background_loop()
                result = asyncio.run_coroutine_threadsafe(_awaited_with(asked, result), loop).result()
            return json.dumps({"content": _content(result)})
        except Exception as error:  # noqa: BLE001 - every failure is the model's to see
            value = _suspended(error)
            if value is not _MISSING:
                return json.dumps({"suspend": value, "description": value if isinstance(value, str) else None}, default=str)
            return json.dumps(
                {"content": f"Error: {type(error).__name__}: {error}", "error": True}
            )

    adapter.__name__ = f"tool_{name}"
    return adapter


async def _await(awaitable: Any) -> Any:
    return await awaitable


def tool_definition(obj: Any) -> ToolDefinition:
    """A callable (or a LangChain tool object) as a tool."""
    if hasattr(obj, "name") and hasattr(obj, "invoke") and not inspect.isfunction(obj):
        return _langchain_tool(obj)
    if not callable(obj):
        raise TypeError(f"tools must be functions, not {type(obj).__name__}: {obj!r}")
    fn = obj
    name = getattr(fn, "__name__", None) or type(fn).__name__
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise ValueError(f"tool name {name!r} must be 1-64 letters, digits, _ or -")
    summary, param_docs = _docstring(fn)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # noqa: BLE001 - unresolvable hints fall back to the raw annotations
        hints = {}
    signature = inspect.signature(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    runtime_param = None
    convert: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = hints.get(param.name, param.annotation)
        if _is_runtime(param.name, annotation):
            runtime_param = param.name
            continue
        schema = schema_of(annotation)
        if param.name in param_docs and "description" not in schema:
            schema["description"] = param_docs[param.name]
        if param.default is not inspect.Parameter.empty:
            try:
                json.dumps(param.default)
                schema["default"] = param.default
            except (TypeError, ValueError):
                pass
        else:
            required.append(param.name)
        if _pydantic_model(annotation):
            convert[param.name] = annotation
        properties[param.name] = schema
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)
    )
    return ToolDefinition(
        name=name,
        description=summary or f"Calls {name}.",
        parameters=parameters,
        adapter=_adapter(name, fn, is_async, runtime_param, convert),
        mutating=_is_mutating(fn),
    )


def _langchain_tool(obj: Any) -> ToolDefinition:
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    args_schema = getattr(obj, "tool_call_schema", None) or getattr(obj, "args_schema", None)
    if isinstance(args_schema, dict):
        schema = args_schema
    elif args_schema is not None and hasattr(args_schema, "model_json_schema"):
        schema = _inline_defs(args_schema.model_json_schema())
    schema = {k: v for k, v in schema.items() if k not in ("title", "description")}
    schema.setdefault("type", "object")

    def call(**args: Any) -> Any:
        return obj.invoke(args)

    return ToolDefinition(
        name=str(obj.name),
        description=str(getattr(obj, "description", "") or f"Calls {obj.name}."),
        parameters=schema,
        adapter=_adapter(str(obj.name), call, False, None, {}),
        mutating=_is_mutating(obj),
    )
