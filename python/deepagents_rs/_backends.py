"""Where the agent's files live: the built-in backends (run in Rust), backends written in
Python, and the storage of threads and long-term memory."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import importlib
import json
import os
import pathlib
import re
import uuid
import weakref
from typing import Any, Callable, Mapping, Sequence

from ._messages import message_from_wire, message_to_wire
from ._protocol import (
    BackendProtocol,
    DeleteResult,
    EditResult,
    ExecuteResponse,
    FileData,
    FileDownloadResponse,
    FileInfo,
    FileUploadResponse,
    GlobResult,
    GrepMatch,
    GrepResult,
    LsResult,
    ReadResult,
    SandboxBackendProtocol,
    WriteResult,
)

EMPTY_CONTENT_WARNING = "System reminder: File exists but has empty contents"
EMPTY_OLD_STRING_ERROR = "Error: old_string cannot be empty. Provide the exact text to replace."

# Read back as base64 (``encoding="base64"``) rather than text, as the reference does.
_BINARY_SUFFIXES = frozenset(
    ".png .jpg .jpeg .gif .webp .bmp .ico .tif .tiff .heic .pdf .mp3 .wav .ogg .flac .m4a .aac"
    " .mp4 .mov .avi .webm .mkv .mpeg .mpg .zip .gz .tar .7z .bin .exe .so .dylib .dll".split()
)


def slice_lines(content: str, offset: int, limit: int) -> ReadResult:
    """The window of ``limit`` lines from line ``offset`` (0-based) of ``content`` as a
    ``ReadResult``: raw text (line ends kept, CRLF as LF) and its 1-based line range."""
    offset, limit = max(int(offset), 0), max(int(limit), 0)
    if not content.strip():
        return ReadResult(file_data=FileData(content=content, encoding="utf-8"))
    if limit == 0:
        return ReadResult(file_data=FileData(content="", encoding="utf-8"), no_lines_requested=True)
    lines = content.splitlines(keepends=True)
    if offset >= len(lines):
        return ReadResult(error=f"Line offset {offset} exceeds file length ({len(lines)} lines)")
    end = min(offset + limit, len(lines))
    text = "".join(lines[offset:end]).replace("\r\n", "\n").replace("\r", "\n")
    return ReadResult(
        file_data=FileData(content=text, encoding="utf-8"),
        total_lines=len(lines),
        start_line=offset + 1,
        end_line=end,
        next_offset=end if end < len(lines) else None,
    )


def _iso(ms: Any) -> str | None:
    if not isinstance(ms, (int, float)):
        return None
    return datetime.datetime.fromtimestamp(ms / 1000).isoformat()


def _entry(info: Mapping[str, Any], listing: bool) -> FileInfo:
    path = str(info.get("path", ""))
    is_dir = bool(info.get("is_dir", False))
    if is_dir and listing and not path.endswith("/"):
        path += "/"
    entry = FileInfo(path=path, is_dir=is_dir, size=0 if is_dir else int(info.get("size", 0) or 0))
    modified = _iso(info.get("modified_at_ms"))
    if modified is not None:
        entry["modified_at"] = modified
    return entry


class _Spec:
    def spec(self, objects: list[Any]) -> dict[str, Any]:
        raise NotImplementedError


class _Direct(_Spec, BackendProtocol):
    """The reference protocol's methods on a built-in backend, for calls outside a run: the
    backend is built natively from its description, once, and called in Rust."""

    _native_backend: Any = None

    def _native(self) -> Any:
        if self._native_backend is None:
            from . import _native

            objects: list[Any] = []
            spec = self.spec(objects)
            self._native_backend = _native.NativeBackend(json.dumps(spec), objects)
        return self._native_backend

    def _path(self, path: str | None) -> str:
        path = path or "/"
        return path if path.startswith("/") else "/" + path

    def _op(self, op: str, **args: Any) -> tuple[Any, dict[str, Any] | None]:
        answer = json.loads(self._native().call(op, json.dumps(args)))
        return answer.get("ok"), answer.get("error")

    def ls(self, path: str) -> LsResult:
        found, error = self._op("ls", path=self._path(path))
        if error:
            if error["kind"] in ("not_found", "invalid_path"):
                return LsResult(error=f"Path '{path}': path_not_found")
            if error["kind"] == "not_a_directory":
                return LsResult(error=f"Path '{path}': not_a_directory")
            return LsResult(error=f"Cannot list '{path}': {error['message']}")
        return LsResult(entries=sorted((_entry(i, True) for i in found), key=lambda e: e["path"]))

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        [(data, code)] = self._native().download([self._path(file_path)])
        if data is None:
            if code in ("file_not_found", "is_directory"):
                return ReadResult(error=f"File '{file_path}' not found")
            return self._read_page(file_path, offset, limit)
        if os.path.splitext(file_path)[1].lower() not in _BINARY_SUFFIXES:
            try:
                text = bytes(data).decode("utf-8")
            except UnicodeDecodeError:
                pass
            else:
                if not text.strip():
                    return ReadResult(file_data=FileData(content=EMPTY_CONTENT_WARNING, encoding="utf-8"))
                return slice_lines(text, offset, limit)
        return ReadResult(file_data=FileData(content=base64.standard_b64encode(data).decode("ascii"), encoding="base64"))

    def _read_page(self, file_path: str, offset: int, limit: int) -> ReadResult:
        # A file too large to read whole: the native backend pages it (line ends are LF).
        offset, limit = max(int(offset), 0), max(int(limit), 0)
        page, error = self._op("read", path=self._path(file_path), offset=offset, limit=limit)
        if error:
            return ReadResult(error=f"Error reading file '{file_path}': {error['message']}")
        if page.get("kind") == "binary":
            return ReadResult(file_data=FileData(content=str(page.get("data", "")), encoding="base64"))
        lines, total = [str(line) for line in page.get("lines", [])], int(page.get("total_lines", 0))
        if not lines:
            return ReadResult(file_data=FileData(content="", encoding="utf-8"), no_lines_requested=limit == 0)
        end = offset + len(lines)
        return ReadResult(
            file_data=FileData(content="\n".join(lines) + ("\n" if end < total else ""), encoding="utf-8"),
            total_lines=total,
            start_line=offset + 1,
            end_line=end,
            next_offset=end if end < total else None,
        )

    def write(self, file_path: str, content: str) -> WriteResult:
        _, error = self._op("write", path=self._path(file_path), content=content)
        if error:
            return WriteResult(error=f"Error writing file '{file_path}': {error['message']}")
        return WriteResult(path=file_path)

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:
        if not old_string:
            return EditResult(error=EMPTY_OLD_STRING_ERROR)
        count, error = self._op("edit", path=self._path(file_path), old=old_string, new=new_string, replace_all=replace_all)
        if error:
            kind = error["kind"]
            if kind in ("not_found", "is_directory"):
                return EditResult(error=f"Error: File '{file_path}' not found")
            if kind == "string_not_found":
                return EditResult(error=f"Error: String not found in file: '{old_string}'")
            if kind == "not_unique":
                return EditResult(
                    error=f"Error: String '{old_string}' appears {error.get('count') or 2} times in file."
                    " Use replace_all=True to replace all instances, or provide a more specific string"
                    " with surrounding context."
                )
            return EditResult(error=f"Error editing file '{file_path}': {error['message']}")
        return EditResult(path=file_path, occurrences=int(count))

    def delete(self, file_path: str) -> DeleteResult:
        _, error = self._op("delete", path=self._path(file_path))
        if error:
            if error["kind"] == "not_found":
                return DeleteResult(error=f"Error: '{file_path}' not found")
            return DeleteResult(error=f"Error deleting '{file_path}': {error['message']}")
        return DeleteResult(path=file_path)

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> GrepResult:
        found, error = self._op(
            "grep", pattern=pattern, path=self._path(path), glob=glob, max_count=100_000 if max_count is None else max_count
        )
        if error:
            if error["kind"] in ("not_found", "invalid_path"):
                return GrepResult(matches=[])
            return GrepResult(error=error["message"], matches=[])
        matches = [
            GrepMatch(path=str(m["path"]), line=int(m["line_number"]), text=str(m["line"])) for m in found.get("matches", [])
        ]
        return GrepResult(matches=matches, truncated=bool(found.get("truncated", False)))

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        found, error = self._op("glob", pattern=pattern, path=self._path(path))
        if error:
            if error["kind"] in ("not_found", "not_a_directory"):
                return GlobResult(matches=[])
            return GlobResult(error=error["message"])
        matches = [_entry(i, False) for i in found.get("files", []) if not i.get("is_dir")]
        truncated = bool(found.get("truncated", False))
        return GlobResult(matches=matches, truncated=truncated, truncation_reason="budget" if truncated else None)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        codes = self._native().upload([(self._path(p), bytes(data)) for p, data in files])
        return [FileUploadResponse(path=p, error=code) for (p, _), code in zip(files, codes)]

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        answers = self._native().download([self._path(p) for p in paths])
        return [FileDownloadResponse(path=p, content=data, error=code) for p, (data, code) in zip(paths, answers)]

    # The names of earlier deepagents releases (plain lists; errors as strings).
    def ls_info(self, path: str) -> list[FileInfo]:
        return self.ls(path).entries or []

    def grep_raw(self, pattern: str, path: str | None = None, glob: str | None = None) -> list[GrepMatch] | str:
        result = self.grep(pattern, path, glob)
        return result.error if result.error else list(result.matches or [])

    def glob_info(self, pattern: str, path: str = "/") -> list[FileInfo]:
        return self.glob(pattern, path).matches or []


class StateBackend(_Direct):
    """Files in the thread's state, checkpointed with it (the default). Called directly,
    outside a run, it keeps files in a scratch state of its own."""

    def __init__(self, runtime: Any = None) -> None:
        del runtime  # the reference's factories pass one; the state is the run's here

    def spec(self, objects: list[Any]) -> dict[str, Any]:
        return {"kind": "state"}


class FilesystemBackend(_Direct):
    """Files on disk under ``root_dir`` (default: the working directory). With
    ``virtual_mode`` (the default) every path is confined to the root; without it paths are
    host paths, relative ones under the root. ``max_file_size_mb`` is accepted and ignored
    (the native backend's limit is 10 MiB)."""

    def __init__(
        self, root_dir: str | os.PathLike[str] | None = None, virtual_mode: bool = True, max_file_size_mb: int = 10
    ) -> None:
        self.root_dir = None if root_dir is None else os.fspath(root_dir)
        self.virtual_mode = virtual_mode
        self.max_file_size_mb = max_file_size_mb

    @property
    def cwd(self) -> pathlib.Path:
        """The root, resolved."""
        return pathlib.Path(self.root_dir or os.getcwd()).resolve()

    def _path(self, path: str | None) -> str:
        if self.virtual_mode or path is None:
            return super()._path(path)
        return path if os.path.isabs(path) else os.path.normpath(os.path.join(self.cwd, path))

    def spec(self, objects: list[Any]) -> dict[str, Any]:
        return {"kind": "filesystem", "root_dir": self.root_dir, "virtual_mode": self.virtual_mode}


class LocalShellBackend(FilesystemBackend, SandboxBackendProtocol):
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
        self._id = f"local-{uuid.uuid4().hex[:8]}"

    @property
    def id(self) -> str:
        """This backend's id (``local-`` and 8 hex digits)."""
        return self._id

    def execute(self, command: str, *, timeout: int | float | None = None) -> ExecuteResponse:
        """Runs ``command`` with ``sh -c`` in the root (``timeout`` seconds: the backend's
        default when ``None``)."""
        if not command or not isinstance(command, str):
            return ExecuteResponse(output="Error: Command must be a non-empty string.", exit_code=1)
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        found, error = self._op("execute", command=command, timeout=timeout)
        if error:
            return ExecuteResponse(output=f"Error executing command: {error['message']}", exit_code=1)
        output, code = str(found.get("output", "")) or "<no output>", found.get("exit_code")
        if code:  # as the reference reports a failure
            output = f"{output.rstrip()}\n\nExit code: {code}"
        return ExecuteResponse(output=output, exit_code=code, truncated=bool(found.get("truncated", False)))

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


NamespaceFactory = Callable[[Any], "tuple[str, ...]"]
"""A namespace as a function of the runtime (``rt.context`` is ``invoke``'s ``context=``)."""


@dataclasses.dataclass
class NamespaceRuntime:
    """What a ``StoreBackend`` namespace function is given: the run's ``context`` object
    (``invoke(…, context=…)``; ``None`` outside a run), its ``store`` and its ``config``
    (``{"configurable": {"thread_id", "assistant_id"}}``). ``server_info`` is ``None``: no
    LangGraph server is involved."""

    context: Any = None
    store: Any = None
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    server_info: Any = None
    stream_writer: Any = None
    previous: Any = None


class _NamespaceAdapter:
    def __init__(self, function: Callable[[Any], Any], store: Any) -> None:
        self.function = function
        self.store = store

    def __call__(self, context: Any, thread_id: str | None, assistant_id: str | None) -> list[str]:
        configurable = {"thread_id": thread_id, "assistant_id": assistant_id}
        runtime = NamespaceRuntime(context=context, store=self.store, config={"configurable": configurable})
        return [str(part) for part in self.function(runtime)]


class StoreBackend(_Direct):
    """Files in a long-term store, under ``namespace`` (default ``("filesystem",)``): shared
    across threads. ``namespace`` is a tuple, or a function of the runtime called on every
    operation (a ``NamespaceRuntime``: ``rt.context`` is ``invoke``'s ``context=``). The store
    is ``store=`` (``InMemoryStore()``, ``SqliteStore(path)``, ``PostgresStore(url)``), else the
    agent's (``create_deep_agent(store=…)``); calling the backend directly needs ``store=``."""

    def __init__(
        self,
        runtime: Any = None,
        *,
        namespace: Sequence[str] | Callable[[Any], Sequence[str]] | None = None,
        store: Any = None,
    ) -> None:
        del runtime
        self.namespace_factory = namespace if callable(namespace) else None
        self.namespace = None if namespace is None or callable(namespace) else [str(n) for n in namespace]
        self.store = store

    def spec(self, objects: list[Any]) -> dict[str, Any]:
        store = None if self.store is None else storage_index(self.store, "StoreBackend(store=…)", objects)
        spec: dict[str, Any] = {"kind": "store", "namespace": self.namespace, "store": store}
        if self.namespace_factory is not None:
            objects.append(_NamespaceAdapter(self.namespace_factory, self.store))
            spec["namespace_fn"] = len(objects) - 1
        return spec


class CompositeBackend(_Direct):
    """Routes paths by prefix (longest wins) to other backends, ``default`` for the rest.
    ``artifacts_root`` is accepted and ignored."""

    def __init__(self, default: Any, routes: Mapping[str, Any], *, artifacts_root: str = "/") -> None:
        self.default = default
        self.routes = dict(routes)
        self.artifacts_root = artifacts_root

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
    if callable(backend) and not isinstance(backend, type) and not callable(getattr(backend, "read", None)):
        # A factory of the reference's earlier releases (``backend=lambda rt: StateBackend(rt)``):
        # the backends here take the run's data when they run, so it is called once, now.
        return backend_spec(backend(NamespaceRuntime()), objects)
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
    if "is a directory" in lower or "is_directory" in lower:
        return "is_directory"
    if "not_a_directory" in lower or "not a directory" in lower:
        return "not_a_directory"
    if "not found" in lower or "not_found" in lower or "does not exist" in lower or "no such file" in lower:
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
        is_dir = bool(_field(item, "is_dir", default=path.endswith("/") and path != "/"))
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
        data = _field(result, "file_data") if not isinstance(result, str) else None
        if data is not None:  # a ReadResult
            text = _field(data, "content", default="")
            if _field(data, "encoding", default="utf-8") == "base64":
                text = base64.standard_b64decode(str(text)).decode("utf-8", errors="replace")
            elif text == EMPTY_CONTENT_WARNING:
                text = ""
        else:
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


def _utc_iso(ms: int) -> str:
    """An ISO time with its zone, as the reference writes file times."""
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc).isoformat()


def _ms(value: Any) -> int:
    """Milliseconds since the epoch of a datetime or an ISO string; 0 when unknown."""
    if isinstance(value, str):
        try:
            value = datetime.datetime.fromisoformat(value)
        except ValueError:
            return 0
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return int(value.timestamp() * 1000)
    return 0


def _file_to_reference(value: Any) -> Any:
    """A file as the agent stores it, as the reference's file data (``content``,
    ``encoding``, ISO times), so LangGraph code reads what the agent wrote; other values
    unchanged."""
    content = value.get("content") if isinstance(value, dict) else None
    if not (isinstance(content, dict) and "modified_at_ms" in value):
        return value
    modified = int(value.get("modified_at_ms") or 0)
    created = int(value.get("created_at_ms") or modified)
    if content.get("encoding") == "binary":
        text, encoding = content.get("data", ""), "base64"
    else:
        text, encoding = content.get("text", ""), "utf-8"
    return {"content": text, "encoding": encoding, "created_at": _utc_iso(created), "modified_at": _utc_iso(modified)}


def _file_from_reference(value: Any) -> Any:
    """The reference's file data (what LangGraph code put in the store) as the agent's file
    record; other values unchanged."""
    if not (isinstance(value, dict) and "content" in value and ("modified_at" in value or "created_at" in value)):
        return value
    content = value["content"]
    if isinstance(content, list):
        content = "\n".join(str(line) for line in content)
    if not isinstance(content, str):
        return value
    modified = _ms(value.get("modified_at")) or _ms(value.get("created_at"))
    record: dict[str, Any] = {"modified_at_ms": modified, "created_at_ms": _ms(value.get("created_at")) or modified}
    if value.get("encoding") == "base64":
        record["content"] = {"encoding": "binary", "mime_type": "application/octet-stream", "data": content}
    else:
        record["content"] = {"encoding": "text", "text": content}
    return record


def _store_item(item: Any) -> dict[str, Any]:
    created, updated = _ms(getattr(item, "created_at", None)), _ms(getattr(item, "updated_at", None))
    return {
        "namespace": list(item.namespace),
        "key": item.key,
        "value": _file_from_reference(item.value),
        "created_at_ms": created,
        "updated_at_ms": updated or created,
    }


class LangGraphStoreAdapter:
    """Calls a LangGraph store's methods (``get``, ``put``, ``delete``, ``search``) for the
    native side, answering ``{"ok": …}`` or ``{"error": …}``; files cross in the reference's
    format."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def call(self, op: str, args_json: str) -> str:
        args = json.loads(args_json)
        try:
            return json.dumps({"ok": getattr(self, "_" + op)(**args)}, default=str)
        except Exception as error:  # noqa: BLE001 - the agent sees the failure
            return json.dumps({"error": f"{type(error).__name__}: {error}"})

    def _get(self, namespace: list[str], key: str) -> dict[str, Any] | None:
        item = self.store.get(tuple(namespace), key)
        return None if item is None else _store_item(item)

    def _put(self, namespace: list[str], key: str, value: Any) -> None:
        self.store.put(tuple(namespace), key, _file_to_reference(value))

    def _delete(self, namespace: list[str], key: str) -> bool:
        existed = self.store.get(tuple(namespace), key) is not None
        self.store.delete(tuple(namespace), key)
        return existed

    def _search(self, namespace_prefix: list[str], key_prefix: str, offset: int, limit: int) -> list[dict[str, Any]]:
        # A LangGraph search pages in its own order: every match is read, then ordered as the
        # agent expects (namespace, then key) and paged here.
        found, page, start = [], 1000, 0
        while True:
            items = self.store.search(tuple(namespace_prefix), limit=page, offset=start)
            found.extend(items)
            if len(items) < page:
                break
            start += page
        wanted = sorted((i for i in found if str(i.key).startswith(key_prefix)), key=lambda i: (list(i.namespace), i.key))
        return [_store_item(i) for i in wanted[offset : offset + limit]]


_RUN_CHANNEL = "__deepagents_run__"


class LangGraphSaverAdapter:
    """Keeps the agent's threads in a LangGraph checkpoint saver for the native side,
    answering ``{"ok": …}`` or ``{"error": …}``. Each checkpoint holds the state in the
    channels LangGraph's deepagents uses (``messages`` as LangChain messages, ``todos``,
    ``files``) and the whole run, exactly, in a channel of its own; its metadata numbers it
    (``deepagents_checkpoint``: 1, 2, 3… within the thread). Checkpoints without that run — a
    thread LangGraph's deepagents wrote — are read from their channels."""

    def __init__(self, saver: Any) -> None:
        self.saver = saver

    def call(self, op: str, args_json: str) -> str:
        args = json.loads(args_json)
        try:
            return json.dumps({"ok": getattr(self, "_" + op)(**args)}, default=str)
        except Exception as error:  # noqa: BLE001 - the run reports it
            return json.dumps({"error": f"{type(error).__name__}: {error}"})

    @staticmethod
    def _config(thread_id: str, checkpoint_id: str | None = None) -> dict[str, Any]:
        configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
        if checkpoint_id is not None:
            configurable["checkpoint_id"] = checkpoint_id
        return {"configurable": configurable}

    def _history(self, thread_id: str) -> list[Any]:
        """The thread's checkpoints, oldest first, with the number each goes by."""
        tuples = list(self.saver.list(self._config(thread_id)))
        tuples.reverse()
        return tuples

    @staticmethod
    def _number(checkpoint: Any, position: int) -> int:
        number = (checkpoint.metadata or {}).get("deepagents_checkpoint")
        return int(number) if isinstance(number, int) else position

    def _append(self, thread_id: str, run: str, values: dict[str, Any]) -> int:
        base = importlib.import_module("langgraph.checkpoint.base")
        ids = importlib.import_module("langgraph.checkpoint.base.id")
        latest = self.saver.get_tuple(self._config(thread_id))
        if latest is None:
            number, previous_versions, parent = 1, {}, None
        else:
            known = (latest.metadata or {}).get("deepagents_checkpoint")
            number = int(known) + 1 if isinstance(known, int) else len(self._history(thread_id)) + 1
            previous_versions = dict(latest.checkpoint.get("channel_versions") or {})
            parent = latest.checkpoint["id"]
        channels: dict[str, Any] = {
            "messages": [message_from_wire(m) for m in values.get("messages") or []],
            "todos": values.get("todos") or [],
            "files": values.get("files") or {},
            _RUN_CHANNEL: run,
        }
        if values.get("structured_response") is not None:
            channels["structured_response"] = values["structured_response"]
        versions = {name: self.saver.get_next_version(previous_versions.get(name), None) for name in channels}
        checkpoint = base.empty_checkpoint()
        checkpoint["id"] = str(ids.uuid6(clock_seq=number))
        checkpoint["channel_values"] = channels
        checkpoint["channel_versions"] = dict(versions)
        metadata = {"source": "loop", "step": number, "parents": {}, "deepagents_checkpoint": number}
        self.saver.put(self._config(thread_id, parent), checkpoint, metadata, versions)
        return number

    def _load(self, thread_id: str, at: int | None) -> dict[str, Any] | None:
        if at is None:
            found = self.saver.get_tuple(self._config(thread_id))
        else:
            found = next((c for i, c in enumerate(self._history(thread_id), 1) if self._number(c, i) == at), None)
        if found is None:
            return None
        channels = found.checkpoint.get("channel_values") or {}
        if isinstance(channels.get(_RUN_CHANNEL), str):
            return {"run": channels[_RUN_CHANNEL]}
        values: dict[str, Any] = {"messages": [message_to_wire(m) for m in channels.get("messages") or []]}
        if channels.get("todos"):
            values["todos"] = channels["todos"]
        if channels.get("files"):
            values["files"] = {path: f for path, f in dict(channels["files"]).items() if f is not None}
        return {"values": values}

    def _checkpoints(self, thread_id: str) -> list[dict[str, Any]]:
        return [
            {
                "id": self._number(c, i),
                "created_at_ms": _iso_ms(c.checkpoint.get("ts")),
                "messages": len((c.checkpoint.get("channel_values") or {}).get("messages") or []),
            }
            for i, c in enumerate(self._history(thread_id), 1)
        ]

    def _threads(self) -> list[dict[str, Any]]:
        threads: dict[str, dict[str, Any]] = {}
        for c in self.saver.list(None):
            thread_id = str(c.config["configurable"]["thread_id"])
            entry = threads.setdefault(thread_id, {"thread_id": thread_id, "checkpoints": 0, "updated_at_ms": 0})
            entry["checkpoints"] += 1
            entry["updated_at_ms"] = max(entry["updated_at_ms"], _iso_ms(c.checkpoint.get("ts")))
        return list(threads.values())

    def _delete_thread(self, thread_id: str) -> bool:
        children = {
            str(c.config["configurable"]["thread_id"])
            for c in self.saver.list(None)
            if str(c.config["configurable"]["thread_id"]).startswith(thread_id + "/")
        }
        existed = self.saver.get_tuple(self._config(thread_id)) is not None
        for thread in [thread_id, *sorted(children)]:
            self.saver.delete_thread(thread)
        return existed


def _iso_ms(ts: Any) -> int:
    if not isinstance(ts, str):
        return 0
    try:
        return int(datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return 0


class _LangGraphSaver(_Storage):
    """A LangGraph checkpoint saver given as the agent's checkpointer: it keeps the threads."""

    def __init__(self, saver: Any) -> None:
        self.saver = saver

    def native(self) -> Any:
        if self._native is None:
            from . import _native

            self._native = _native.NativeStorage.python_checkpointer(LangGraphSaverAdapter(self.saver))
        return self._native


def _is_langgraph_saver(value: Any) -> bool:
    return all(callable(getattr(value, name, None)) for name in ("get_tuple", "put", "list")) and any(
        cls.__module__.startswith("langgraph.checkpoint") for cls in type(value).__mro__
    )


class _LangGraphStore(_Storage):
    """A LangGraph store object given as the agent's store: its items are the agent's."""

    _role = "store"

    def __init__(self, store: Any) -> None:
        self.store = store

    def native(self) -> Any:
        if self._native is None:
            from . import _native

            self._native = _native.NativeStorage.python_store(LangGraphStoreAdapter(self.store))
        return self._native


def _is_langgraph_store(value: Any) -> bool:
    return all(callable(getattr(value, name, None)) for name in ("get", "put", "delete", "search")) and any(
        cls.__module__.startswith("langgraph.store") for cls in type(value).__mro__
    )


_STAND_INS: "weakref.WeakKeyDictionary[Any, _Storage]" = weakref.WeakKeyDictionary()
_STAND_INS_BY_ID: dict[int, tuple[Any, _Storage]] = {}


def _standing_in(value: Any) -> _Storage:
    """Our in-memory storage in place of LangGraph's object `value`: the same one every time
    it is passed."""
    stand_in: _Storage = _LangGraphStore(value) if _is_langgraph_store(value) else _LangGraphSaver(value)
    try:
        return _STAND_INS.setdefault(value, stand_in)
    except TypeError:
        # Not weakly referenceable: kept (with the object, so its id is not reused) for the
        # life of the process.
        return _STAND_INS_BY_ID.setdefault(id(value), (value, stand_in))[1]


def storage_index(value: Any, what: str, objects: list[Any]) -> int | None:
    """The index in ``objects`` of the opened storage ``value`` describes."""
    if value is None or value is False:
        return None
    if not isinstance(value, _Storage):
        # LangGraph's savers and stores are used through adapters, one per object: the
        # threads and items are in the user's object, and what it held is the agent's.
        if value is True:
            value = InMemorySaver()
        elif _is_langgraph_saver(value) or _is_langgraph_store(value):
            value = _standing_in(value)
        else:
            value = None
    if value is not None:
        objects.append(value.native())
        return len(objects) - 1
    raise TypeError(
        f"{what} must be a LangGraph checkpoint saver (or this package's InMemorySaver(), SqliteSaver(path), PostgresSaver(url)); "
        f"stores: a LangGraph store or InMemoryStore, SqliteStore, PostgresStore; not {type(value).__name__}"
    )
