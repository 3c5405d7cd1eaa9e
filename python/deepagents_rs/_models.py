"""LangChain chat model objects read as native model settings.

``ChatOpenAI(model=…, base_url=…, api_key=…, temperature=…)`` and its kin are how the
reference's users pass models; their settings are read off the object (without importing the
provider packages, which may be absent) and the harness's own client for that provider is
built with them, so the object is never called.
"""

from __future__ import annotations

import importlib
import json
import warnings
from typing import Any, Callable

SUPPORTED = (
    "langchain_openai.ChatOpenAI",
    "langchain_anthropic.ChatAnthropic",
    "langchain_google_genai.ChatGoogleGenerativeAI",
    "langchain_ollama.ChatOllama",
)


def _package_and_name(obj: Any) -> tuple[str, str]:
    cls = type(obj)
    return cls.__module__.split(".")[0], cls.__qualname__


def _secret(value: Any) -> str | None:
    """A key as a string: a Pydantic ``SecretStr``, a string, or a function returning one
    (called once, now)."""
    if value is None:
        return None
    reveal = getattr(value, "get_secret_value", None)
    if callable(reveal):
        value = reveal()
    elif callable(value):
        value = value()
    if not isinstance(value, str):
        raise TypeError(f"the model's API key must be a string or SecretStr, not {type(value).__name__}")
    return value or None


def _number(value: Any) -> float | None:
    """A timeout in seconds: a number, a ``(connect, read)`` pair or an ``httpx.Timeout``
    (its read timeout)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, tuple) and value:
        return _number(value[-1])
    read = getattr(value, "read", None)
    if isinstance(read, (int, float)):
        return float(read)
    return None


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(s) for s in value]


def _ignored(obj: Any, names: dict[str, Callable[[Any], bool]]) -> None:
    """Warns about settings the object has that the native client does not apply."""
    set_ = [name for name, is_set in names.items() if is_set(getattr(obj, name, None))]
    if set_:
        _, cls = _package_and_name(obj)
        warnings.warn(
            f"{cls}: deepagents_rs calls the provider with its own client and does not apply {', '.join(set_)}",
            UserWarning,
            stacklevel=6,
        )


def _truthy(value: Any) -> bool:
    return bool(value)


def _effort(obj: Any) -> str | None:
    effort = getattr(obj, "reasoning_effort", None)
    if effort is None:
        reasoning = getattr(obj, "reasoning", None)
        if isinstance(reasoning, dict):
            effort = reasoning.get("effort")
    return None if effort is None else str(effort)


def _openai(obj: Any) -> dict[str, Any]:
    responses = getattr(obj, "use_responses_api", None) is True or str(getattr(obj, "output_version", None) or "").startswith("responses")
    _ignored(
        obj,
        {
            "model_kwargs": _truthy,
            "extra_body": _truthy,
            "default_headers": _truthy,
            "default_query": _truthy,
            "organization": _truthy,
            "openai_organization": _truthy,
            "openai_proxy": _truthy,
            "http_client": _truthy,
            "logit_bias": _truthy,
            "frequency_penalty": lambda v: v not in (None, 0),
            "presence_penalty": lambda v: v not in (None, 0),
            "seed": lambda v: v is not None,
            "n": lambda v: v not in (None, 1),
        },
    )
    return {
        "spec": f"{'openai' if responses else 'openai_chat'}:{obj.model_name}",
        "base_url": getattr(obj, "openai_api_base", None),
        "api_key": _secret(getattr(obj, "openai_api_key", None)),
        "max_retries": getattr(obj, "max_retries", None),
        "timeout": _number(getattr(obj, "request_timeout", None)),
        "max_tokens": getattr(obj, "max_tokens", None),
        "temperature": getattr(obj, "temperature", None),
        "top_p": getattr(obj, "top_p", None),
        "stop": _stop(getattr(obj, "stop", None)),
        "reasoning_effort": _effort(obj),
    }


def _anthropic(obj: Any) -> dict[str, Any]:
    _ignored(
        obj,
        {
            "model_kwargs": _truthy,
            "default_headers": _truthy,
            "betas": _truthy,
            "anthropic_proxy": _truthy,
            "top_k": lambda v: v is not None,
            "mcp_servers": _truthy,
        },
    )
    effort = _effort(obj)
    thinking = getattr(obj, "thinking", None)
    if effort is None and isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = int(thinking.get("budget_tokens") or 0)
        effort = "low" if budget <= 4096 else "medium" if budget <= 16384 else "high"
    return {
        "spec": f"anthropic:{obj.model}",
        "base_url": getattr(obj, "anthropic_api_url", None),
        "api_key": _secret(getattr(obj, "anthropic_api_key", None)),
        "max_retries": getattr(obj, "max_retries", None),
        "timeout": _number(getattr(obj, "default_request_timeout", None)),
        "max_tokens": getattr(obj, "max_tokens", None),
        "temperature": getattr(obj, "temperature", None),
        "top_p": getattr(obj, "top_p", None),
        "stop": _stop(getattr(obj, "stop_sequences", None)),
        "reasoning_effort": effort,
    }


def _google(obj: Any) -> dict[str, Any]:
    _ignored(obj, {"safety_settings": _truthy, "top_k": lambda v: v is not None, "additional_headers": _truthy})
    model = str(obj.model)
    base_url = getattr(obj, "base_url", None)
    options = getattr(obj, "client_options", None)
    if base_url is None and isinstance(options, dict):
        base_url = options.get("api_endpoint")
    if isinstance(base_url, str) and "://" not in base_url:
        base_url = f"https://{base_url}"
    budget = getattr(obj, "thinking_budget", None)
    effort = getattr(obj, "thinking_level", None)
    if effort is None and isinstance(budget, int) and budget > 0:
        effort = "low" if budget <= 4096 else "medium" if budget <= 16384 else "high"
    return {
        "spec": f"google_genai:{model.removeprefix('models/')}",
        "base_url": base_url,
        "api_key": _secret(getattr(obj, "google_api_key", None)),
        "max_retries": getattr(obj, "max_retries", None),
        "timeout": _number(getattr(obj, "timeout", None)),
        "max_tokens": getattr(obj, "max_output_tokens", None),
        "temperature": getattr(obj, "temperature", None),
        "top_p": getattr(obj, "top_p", None),
        "stop": _stop(getattr(obj, "stop", None)),
        "reasoning_effort": None if effort is None else str(effort),
    }


def _ollama(obj: Any) -> dict[str, Any]:
    _ignored(obj, {"client_kwargs": _truthy, "format": _truthy, "num_ctx": lambda v: v is not None, "top_k": lambda v: v is not None})
    base_url = getattr(obj, "base_url", None)
    if isinstance(base_url, str):
        # ChatOllama speaks Ollama's own API at the root; the native client its OpenAI one.
        base_url = base_url.rstrip("/")
        if not base_url.endswith("/v1"):
            base_url += "/v1"
    reasoning = getattr(obj, "reasoning", None)
    return {
        "spec": f"ollama:{obj.model}",
        "base_url": base_url,
        "max_tokens": getattr(obj, "num_predict", None),
        "temperature": getattr(obj, "temperature", None),
        "top_p": getattr(obj, "top_p", None),
        "stop": _stop(getattr(obj, "stop", None)),
        "reasoning_effort": reasoning if isinstance(reasoning, str) else None,
    }


_READERS: dict[tuple[str, str], Callable[[Any], dict[str, Any]]] = {
    ("langchain_openai", "ChatOpenAI"): _openai,
    ("langchain_anthropic", "ChatAnthropic"): _anthropic,
    ("langchain_google_genai", "ChatGoogleGenerativeAI"): _google,
    ("langchain_ollama", "ChatOllama"): _ollama,
}


def chat_model_spec(model: Any) -> dict[str, Any] | None:
    """The native model a LangChain chat model object describes (``{"spec", "base_url",
    "api_key", …}``), ``None`` when ``model`` is not of a class whose settings can be read
    (see :func:`is_chat_model` for the rest), and a ``TypeError`` for a model chosen at run
    time or already bound."""
    package, name = _package_and_name(model)
    reader = _READERS.get((package, name))
    if reader is not None:
        spec = reader(model)
        return {key: value for key, value in spec.items() if value is not None and value != []}
    if name == "_ConfigurableModel":
        raise TypeError(
            "init_chat_model(…) with configurable_fields (or without a model) makes a model chosen at run time, "
            "which deepagents_rs does not support: call init_chat_model('provider:model', …) without "
            "configurable_fields, or pass a model object or a 'provider:model' string"
        )
    if "Binding" in name or hasattr(model, "bound"):
        raise TypeError(
            f"a bound model ({name}: bind_tools, bind, with_structured_output, with_retry, …) is not supported; "
            "pass the chat model itself (the agent binds its own tools; use response_format= for structured output)"
        )
    return None


def is_chat_model(model: Any) -> bool:
    """Whether ``model`` is a LangChain chat model the harness calls through Python (one of
    a class it has no client for)."""
    return callable(getattr(model, "invoke", None)) and callable(getattr(model, "bind_tools", None))


def model_name(model: Any) -> str:
    """The name a chat model goes by in errors and spend records: ``python:<class>:<model>``."""
    name = getattr(model, "model_name", None) or getattr(model, "model", None)
    cls = type(model).__qualname__
    return f"python:{cls}:{name}" if isinstance(name, str) and name else f"python:{cls}"


def python_model_adapter(model: Any) -> Callable[[str], str]:
    """What the native side calls for each model call of ``model``: the request as JSON
    (``system``, ``messages`` as LangChain dicts, ``tools``, ``settings``) in, ``{"message",
    "usage"}`` or ``{"error"}`` out. Tools are bound with ``bind_tools`` (a model without
    tool binding, like LangChain's fake models, is called as it is)."""
    from ._messages import message_to_wire
    from ._middleware import MessageCache

    bound: dict[str, Any] = {}
    cache = MessageCache()

    def with_tools(tools: list[dict[str, Any]]) -> Any:
        if not tools:
            return model
        key = json.dumps([t["name"] for t in tools])
        if key not in bound:
            schemas = [{"type": "function", "function": t} for t in tools]
            try:
                bound[key] = model.bind_tools(schemas)
            except NotImplementedError:
                bound[key] = model
        return bound[key]

    def adapter(request_json: str) -> str:
        try:
            request = json.loads(request_json)
            lc = importlib.import_module("langchain_core.messages")
            messages = [cache.message(m) for m in request["messages"]]
            if request.get("system"):
                messages.insert(0, lc.SystemMessage(content=request["system"]))
            settings = request.get("settings") or {}
            kwargs: dict[str, Any] = {}
            if settings.get("stop_sequences"):
                kwargs["stop"] = list(settings["stop_sequences"])
            answer = with_tools(request.get("tools") or []).invoke(messages, **kwargs)
            return json.dumps({"message": ai_to_wire(answer, message_to_wire), "usage": _usage(answer)})
        except Exception as error:  # noqa: BLE001 - the run reports it as the model's failure
            return json.dumps({"error": f"{type(error).__name__}: {error}"})

    adapter.__name__ = f"model_{type(model).__qualname__}"
    return adapter


def ai_to_wire(answer: Any, message_to_wire: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """A model's answer (an ``AIMessage``, a string) as an AI message dict."""
    if isinstance(answer, str):
        return {"type": "ai", "content": answer}
    wire = message_to_wire(answer)
    if wire.get("type") not in ("ai", "AIMessageChunk"):
        raise TypeError(f"the model answered with a {wire.get('type')} message, not an AI message")
    wire["type"] = "ai"
    content = wire.get("content")
    if isinstance(content, list):
        # Provider-specific parts (tool_use, citations…) are carried by tool_calls or dropped.
        wire["content"] = [part for part in content if isinstance(part, str) or (isinstance(part, dict) and part.get("type") in ("text", "reasoning", "thinking"))]
        wire["content"] = [{"type": "text", "text": p} if isinstance(p, str) else p for p in wire["content"]]
    return wire


def _usage(answer: Any) -> dict[str, int]:
    usage = getattr(answer, "usage_metadata", None) or {}
    return {"input_tokens": int(usage.get("input_tokens") or 0), "output_tokens": int(usage.get("output_tokens") or 0)}
