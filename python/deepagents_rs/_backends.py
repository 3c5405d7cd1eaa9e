"""Where the agent's files live: the built-in backends (run in Rust), backends written in
Python, and the storage of threads and long-term memory."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Mapping, Sequence


class _Spec:
    def spec(self, objects: list[Any]) -> dict[str, Any]:
        raise NotImplementedError


class StateBackend(_Spec):
    """Files in the thread's state, checkpointed with it (the default)."""

    def __init__(self, runtime: Any = None) -> None:
        del runtime  # the reference's factories pass one; the state is the run's here

    def spec(self, objects: list[Any]) -> dict[str, Any]:
        return {"kind": "state"}


class FilesystemBackend(_Spec):
    """Files on disk under ``root_dir`` (default: the working directory). With
    ``virtual_mode`` (the default) every path is confined to the root."""

    def __init__(self, root_dir: str | os.PathLike[str] | None = None, virtual_mode: bool = True) -> None:
        self.root_dir = None if root_dir is None else os.fspath(root_dir)
        self.virtual_mode = virtual_mode

    def spec(self, objects: list[Any]) -> dict[str, Any]:
        return {"kind": "filesystem", "root_dir": self.root_dir, "virtual_mode": self.virtual_mode}


class LocalShellBackend(FilesystemBackend):
    """A filesystem backend plus ``execute``: shell commands in ``root_dir``, ``timeout``
    seconds (default 120), output capped at ``max_output_bytes`` (default 100,000), an empty
    environment unless ``env`` or ``inherit_env``. ``sandbox=True`` confines each command to
    the root (bubblewrap or Landlock with seccomp: no writes outside it, no network)."""

    def __init__(
        self,
        root_dir: str | os.PathLike[str] | None = None,
        virtual_mode: bool = True,
        *,
        timeout: float | None = None,
        max_output_bytes: int | None = None,
        env: Mapping[str, str] | None = None,
        inherit_env: bool = False,
        sandbox: bool = False,
    ) -> None:
        super().__init__(root_dir, virtual_mode)
        self.timeout = timeout
        self.max_output_bytes = max_output_bytes
        self.env = dict(env or {})
        self.inherit_env = inherit_env
        self.sandbox = sandbox

    def spec(self, objects: list[Any]) -> dict[str, Any]:
        return {
            "kind": "local_shell",
            "root_dir": self.root_dir,
            "virtual_mode": self.virtual_mode,
            "timeout": self.timeout,
            "max_output_bytes": self.max_output_bytes,
            "env": self.env,
            "inherit_env": self.inherit_env,
            "sandbox": self.sandbox,
        }


class StoreBackend(_Spec):
    """Files in the agent's long-term store (``create_deep_agent(store=…)``), under
    ``namespace`` (default ``("filesystem",)``): shared across threads."""

    def __init__(self, runtime: Any = None, *, namespace: Sequence[str] | None = None) -> None:
        del runtime
        self.namespace = None if namespace is None else [str(n) for n in namespace]

    def spec(self, objects: list[Any]) -> dict[str, Any]:
        return {"kind": "store", "namespace": self.namespace}


class CompositeBackend(_Spec):
    """Routes paths by prefix (longest wins) to other backends, ``default`` for the rest."""

    def __init__(self, default: Any, routes: Mapping[str, Any]) -> None:
        self.default = default
        self.routes = dict(routes)

    def spec(self, objects: list[Any]) -> dict[str, Any]:
        return {
            "kind": "composite",
            "default": backend_spec(self.default, objects),
            "routes": {prefix: backend_spec(b, objects) for prefix, b in self.routes.items()},
        }


def backend_spec(backend: Any, objects: list[Any]) -> dict[str, Any]:
    """The native description of ``backend``; a Python object is adapted and referred to by
    its index in ``objects``."""
    if isinstance(backend, _Spec):
        return backend.spec(objects)
    if isinstance(backend, type) and issubclass(backend, _Spec):
        return backend().spec(objects)
    missing = [m for m in ("read", "write", "edit") if not callable(getattr(backend, m, None))]
    if missing or not (callable(getattr(backend, "ls", None)) or callable(getattr(backend, "ls_info", None))):
        raise TypeError(
            f"{type(backend).__name__} is not a backend: it needs ls (or ls_info), read, write, edit,"
            f" glob (or glob_info) and grep (or grep_raw) methods; missing {missing or ['ls']}"
        )
    objects.append(PythonBackendAdapter(backend))
    return {"kind": "python", "object": len(objects) - 1, "execute": callable(getattr(backend, "execute", None))}


_NUMBERED = re.compile(r"^\s*\d+(?:\.\d+)?\t")


def _field(item: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        if isinstance(item, Mapping) and name in item:
            return item[name]
        if hasattr(item, name):
            return getattr(item, name)
    return default


def _error_kind(message: str) -> str:
    lower = message.lower()
    if "string not found" in lower or "string_not_found" in lower:
        return "string_not_found"
    if "times" in lower and ("appears" in lower or "occurs" in lower) or "multiple" in lower:
        return "not_unique"
    if "already exists" in lower:
        return "exists"
    if "is a directory" in lower:
        return "is_directory"
    if "not found" in lower or "does not exist" in lower or "no such file" in lower:
        return "not_found"
    if "permission" in lower:
        return "permission_denied"
    return "other"


class _Refused(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _checked(result: Any) -> Any:
    error = _field(result, "error")
    if error:
        raise _Refused(_error_kind(str(error)), str(error))
    if isinstance(result, str) and result.startswith("Error"):
        raise _Refused(_error_kind(result), result)
    return result


def _infos(items: Any) -> list[dict[str, Any]]:
    items = _checked(items)
    if not isinstance(items, (list, tuple)):
        items = _field(items, "entries", "files", "matches", default=[]) or []
    out = []
    for item in items:
        if isinstance(item, str):
            out.append({"path": item, "is_dir": item.endswith("/") and item != "/", "size": 0})
            continue
        path = str(_field(item, "path", default=""))
        is_dir = bool(_field(item, "is_dir", default=False))
        if is_dir and len(path) > 1:
            path = path.rstrip("/")
        out.append({"path": path, "is_dir": is_dir, "size": int(_field(item, "size", default=0) or 0)})
    return out


class PythonBackendAdapter:
    """Calls a Python backend's methods for the native side, answering every operation as
    ``{"ok": …}`` or ``{"error": {"kind", "message"}}``. Reference-style results (objects
    or dicts with ``error``, error strings, ``cat -n`` numbered reads) are understood."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def _method(self, *names: str) -> Any:
        for name in names:
            method = getattr(self.backend, name, None)
            if callable(method):
                return method
        raise _Refused("other", f"the {type(self.backend).__name__} backend has no {names[0]}")

    def call(self, op: str, args_json: str) -> str:
        args = json.loads(args_json)
        try:
            return json.dumps({"ok": getattr(self, "_" + op)(**args)})
        except _Refused as refused:
            return json.dumps({"error": {"kind": refused.kind, "message": str(refused)}})
        except FileNotFoundError as error:
            return json.dumps({"error": {"kind": "not_found", "message": str(error)}})
        except IsADirectoryError as error:
            return json.dumps({"error": {"kind": "is_directory", "message": str(error)}})
        except NotADirectoryError as error:
            return json.dumps({"error": {"kind": "not_a_directory", "message": str(error)}})
        except FileExistsError as error:
            return json.dumps({"error": {"kind": "exists", "message": str(error)}})
        except PermissionError as error:
            return json.dumps({"error": {"kind": "permission_denied", "message": str(error)}})
        except Exception as error:  # noqa: BLE001 - the model sees the failure
            return json.dumps({"error": {"kind": "other", "message": f"{type(error).__name__}: {error}"}})

    def _ls(self, path: str) -> list[dict[str, Any]]:
        return _infos(self._method("ls", "ls_info")(path))

    def _read(self, path: str) -> str:
        result = _checked(self._method("read")(path, 0, 1_000_000_000))
        text = _field(result, "content", default=result) if not isinstance(result, str) else result
        if isinstance(text, list):
            text = "\n".join(str(line) for line in text)
        text = str(text or "")
        lines = text.split("\n")
        if lines and all(_NUMBERED.match(line) for line in lines if line):
            text = "\n".join(_NUMBERED.sub("", line, count=1) for line in lines)
        return text

    def _write(self, path: str, content: str) -> None:
        _checked(self._method("write")(path, content))

    def _edit(self, path: str, old: str, new: str, replace_all: bool) -> int:
        result = _checked(self._method("edit")(path, old, new, replace_all))
        return int(_field(result, "occurrences", default=1) or 1)

    def _delete(self, path: str) -> int:
        result = _checked(self._method("delete")(path))
        return int(_field(result, "count", "deleted", default=1) or 1) if not isinstance(result, int) else result

    def _execute(self, command: str, timeout: float | None) -> dict[str, Any]:
        execute = self._method("execute")
        try:
            result = execute(command, timeout=timeout) if timeout is not None else execute(command)
        except TypeError:
            result = execute(command)
        if isinstance(result, str):
            return {"output": result, "exit_code": 0, "truncated": False}
        code = _field(result, "exit_code", "returncode", default=0)
        return {
            "output": str(_field(result, "output", "stdout", default="") or ""),
            "exit_code": None if code is None else int(code),
            "truncated": bool(_field(result, "truncated", default=False)),
        }

    def _glob(self, pattern: str, path: str) -> list[dict[str, Any]]:
        return _infos(self._method("glob", "glob_info")(pattern, path))

    def _grep(self, pattern: str, path: str, glob: str | None, regex: bool, case_insensitive: bool) -> list[dict[str, Any]]:
        del regex, case_insensitive  # the reference protocol searches literally
        found = _checked(self._method("grep", "grep_raw")(pattern, path, glob))
        if not isinstance(found, (list, tuple)):
            found = _field(found, "matches", default=[]) or []
        return [
            {
                "path": str(_field(m, "path", default="")),
                "line_number": int(_field(m, "line", "line_number", default=0) or 0),
                "line": str(_field(m, "text", "line", default="")),
            }
            for m in found
        ]


@dataclasses.dataclass(frozen=True)
class FilesystemPermission:
    """A permission rule: ``operations`` ⊆ {"read", "write"} on ``paths`` (absolute globs),
    ``mode`` "allow", "deny" or "interrupt" (ask for approval). The first rule that matches
    wins; no match allows."""

    operations: Sequence[str]
    paths: Sequence[str]
    mode: str = "allow"

    def spec(self) -> dict[str, Any]:
        return {"operations": list(self.operations), "paths": list(self.paths), "mode": self.mode}


def permission_spec(rule: Any) -> dict[str, Any]:
    if isinstance(rule, FilesystemPermission):
        return rule.spec()
    if isinstance(rule, Mapping):
        return {"operations": list(rule["operations"]), "paths": list(rule["paths"]), "mode": rule.get("mode", "allow")}
    if hasattr(rule, "operations") and hasattr(rule, "paths"):
        return {"operations": list(rule.operations), "paths": list(rule.paths), "mode": getattr(rule, "mode", "allow")}
    raise TypeError(f"a permission rule is a FilesystemPermission or a dict, not {type(rule).__name__}")


class _Storage:
    _role = "checkpointer"
    _native: Any = None

    def spec(self) -> dict[str, Any]:
        raise NotImplementedError

    def native(self) -> Any:
        """The opened storage, shared by every agent given this object."""
        if self._native is None:
            from . import _native

            self._native = _native.NativeStorage(json.dumps(self.spec()), self._role)
        return self._native


class InMemorySaver(_Storage):
    """Threads kept in this process's memory, shared by the agents given this object."""

    def spec(self) -> dict[str, Any]:
        return {"kind": "memory"}


MemorySaver = InMemorySaver


class SqliteSaver(_Storage):
    """Threads kept in a SQLite file: they survive restarts and crashes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    @classmethod
    def from_conn_string(cls, path: str) -> "SqliteSaver":
        return cls(path)

    def spec(self) -> dict[str, Any]:
        return {"kind": "sqlite", "path": self.path}


class PostgresSaver(_Storage):
    """Threads kept in PostgreSQL (``postgres://…``)."""

    def __init__(self, url: str) -> None:
        self.url = url

    @classmethod
    def from_conn_string(cls, url: str) -> "PostgresSaver":
        return cls(url)

    def spec(self) -> dict[str, Any]:
        return {"kind": "postgres", "url": self.url}


class InMemoryStore(InMemorySaver):
    """A long-term store in this process's memory."""

    _role = "store"


class SqliteStore(SqliteSaver):
    """A long-term store in a SQLite file."""

    _role = "store"


class PostgresStore(PostgresSaver):
    """A long-term store in PostgreSQL."""

    _role = "store"


def storage_index(value: Any, what: str, objects: list[Any]) -> int | None:
    """The index in ``objects`` of the opened storage ``value`` describes."""
    if value is None or value is False:
        return None
    if not isinstance(value, _Storage):
        # LangGraph's in-memory savers and stores, passed out of habit: the same thing here.
        if type(value).__name__ in ("InMemorySaver", "MemorySaver") or value is True:
            value = InMemorySaver()
        elif type(value).__name__ == "InMemoryStore":
            value = InMemoryStore()
        else:
            value = None
    if value is not None:
        objects.append(value.native())
        return len(objects) - 1
    raise TypeError(
        f"{what} must be InMemorySaver(), SqliteSaver(path) or PostgresSaver(url) (stores: InMemoryStore, SqliteStore, PostgresStore), not {type(value).__name__}"
    )
