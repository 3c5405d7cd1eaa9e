"""``BaseSandbox``: the file operations of a sandbox built on the four methods a subclass
writes (``execute``, ``id``, ``upload_files``, ``download_files``). Reads and writes move
files with ``download_files``/``upload_files``; listing, globbing, grep and delete run a
small Python script in the sandbox through ``execute`` (so the sandbox needs ``python3``)."""

from __future__ import annotations

import abc
import base64
import datetime
import json
import os
import shlex
from typing import Any

from ._backends import EMPTY_CONTENT_WARNING, EMPTY_OLD_STRING_ERROR, _BINARY_SUFFIXES, slice_lines
from ._protocol import (
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
from .backends.utils import perform_string_replacement

_MARK = "__deepagents_rs_result__"

# Run in the sandbox: one JSON argument (base64) in, one marked JSON line out.
_SCRIPT = r"""
import base64, json, os, re, shutil, sys
a = json.loads(base64.b64decode(sys.argv[1]))
def pattern_re(p):
    out, i = "", 0
    while i < len(p):
        c = p[i]
        if p.startswith("**/", i):
            out += "(?:.*/)?"; i += 3; continue
        if p.startswith("**", i):
            out += ".*"; i += 2; continue
        if c == "*": out += "[^/]*"
        elif c == "?": out += "[^/]"
        elif c == "[":
            j = p.find("]", i + 1)
            if j < 0: out += re.escape(c)
            else:
                body = p[i + 1:j]
                out += "[" + ("^" + body[1:] if body.startswith("!") else body) + "]"; i = j
        else: out += re.escape(c)
        i += 1
    return re.compile(out + r"\Z")
def matcher(p):
    rx = pattern_re(p.lstrip("/"))
    if "/" in p: return lambda rel: bool(rx.match(rel))
    return lambda rel: bool(rx.match(rel.rsplit("/", 1)[-1]))
def files(base):
    if os.path.isfile(base):
        yield base, os.path.basename(base); return
    for root, dirs, names in os.walk(base):
        dirs[:] = sorted(d for d in dirs if d != ".git")
        for n in sorted(names):
            full = os.path.join(root, n)
            yield full, os.path.relpath(full, base)
def info(path, st, is_dir):
    return {"path": path, "is_dir": is_dir, "size": 0 if is_dir else st.st_size, "mtime": st.st_mtime}
op, out = a["op"], None
try:
    if op == "ls":
        out = [info(e.path, e.stat(), e.is_dir()) for e in os.scandir(a["path"])]
    elif op == "glob":
        m = matcher(a["pattern"])
        out = [info(f, os.stat(f), False) for f, rel in files(a["path"]) if m(rel)]
    elif op == "grep":
        m = matcher(a["glob"]) if a.get("glob") else None
        out = []
        for f, rel in files(a["path"]):
            if m and not m(rel): continue
            try:
                with open(f, encoding="utf-8") as h:
                    for n, line in enumerate(h, 1):
                        if a["pattern"] in line:
                            out.append({"path": f, "line": n, "text": line.rstrip("\r\n")})
            except (UnicodeDecodeError, OSError):
                pass
            if a.get("max") is not None and len(out) > a["max"]: break
    elif op == "delete":
        if os.path.isdir(a["path"]) and not os.path.islink(a["path"]): shutil.rmtree(a["path"])
        else: os.remove(a["path"])
    print("\n""" + _MARK + r""" " + json.dumps({"ok": out}))
except FileNotFoundError:
    print("\n""" + _MARK + r""" " + json.dumps({"error": "not_found"}))
except NotADirectoryError:
    print("\n""" + _MARK + r""" " + json.dumps({"error": "not_a_directory"}))
except Exception as e:
    print("\n""" + _MARK + r""" " + json.dumps({"error": type(e).__name__ + ": " + str(e)}))
"""


class BaseSandbox(SandboxBackendProtocol, abc.ABC):
    """A sandbox backend from ``execute``, ``id``, ``upload_files`` and ``download_files``:
    subclass it, implement those four, and the file operations follow."""

    @abc.abstractmethod
    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse: ...

    @property
    @abc.abstractmethod
    def id(self) -> str: ...

    @abc.abstractmethod
    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]: ...

    @abc.abstractmethod
    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]: ...

    def _script(self, **args: Any) -> tuple[Any, str | None]:
        payload = base64.b64encode(json.dumps(args).encode()).decode()
        done = self.execute(f"python3 -c {shlex.quote(_SCRIPT)} {payload}")
        for line in reversed(done.output.splitlines()):
            if line.startswith(_MARK + " "):
                answer = json.loads(line[len(_MARK) + 1 :])
                return answer.get("ok"), answer.get("error")
        return None, f"the sandbox did not run the file script (exit code {done.exit_code}): {done.output[-500:]}"

    def _download(self, path: str) -> tuple[bytes | None, str | None]:
        [answer] = self.download_files([path])
        return answer.content, answer.error

    def ls(self, path: str) -> LsResult:
        found, error = self._script(op="ls", path=path)
        if error == "not_found":
            return LsResult(error=f"Path '{path}': path_not_found")
        if error == "not_a_directory":
            return LsResult(error=f"Path '{path}': not_a_directory")
        if error:
            return LsResult(error=f"Cannot list '{path}': {error}")
        return LsResult(entries=sorted((_info(i, listing=True) for i in found), key=lambda e: e["path"]))

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        data, error = self._download(file_path)
        if data is None:
            if error in ("file_not_found", "is_directory", None):
                return ReadResult(error=f"File '{file_path}' not found")
            return ReadResult(error=f"Error reading file '{file_path}': {error}")
        if os.path.splitext(file_path)[1].lower() not in _BINARY_SUFFIXES:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                pass
            else:
                if not text.strip():
                    return ReadResult(file_data=FileData(content=EMPTY_CONTENT_WARNING, encoding="utf-8"))
                return slice_lines(text, offset, limit)
        return ReadResult(file_data=FileData(content=base64.standard_b64encode(data).decode("ascii"), encoding="base64"))

    def write(self, file_path: str, content: str) -> WriteResult:
        [answer] = self.upload_files([(file_path, content.encode("utf-8"))])
        if answer.error:
            return WriteResult(error=f"Error writing file '{file_path}': {answer.error}")
        return WriteResult(path=file_path)

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:
        if not old_string:
            return EditResult(error=EMPTY_OLD_STRING_ERROR)
        data, _ = self._download(file_path)
        if data is None:
            return EditResult(error=f"Error: File '{file_path}' not found")
        done = perform_string_replacement(data.decode("utf-8", errors="replace"), old_string, new_string, replace_all)
        if isinstance(done, str):
            return EditResult(error=done)
        [answer] = self.upload_files([(file_path, done[0].encode("utf-8"))])
        if answer.error:
            return EditResult(error=f"Error editing file '{file_path}': {answer.error}")
        return EditResult(path=file_path, occurrences=done[1])

    def delete(self, file_path: str) -> DeleteResult:
        _, error = self._script(op="delete", path=file_path)
        if error == "not_found":
            return DeleteResult(error=f"Error: '{file_path}' not found")
        if error:
            return DeleteResult(error=f"Error deleting '{file_path}': {error}")
        return DeleteResult(path=file_path)

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> GrepResult:
        found, error = self._script(op="grep", pattern=pattern, path=path or "/", glob=glob, max=max_count)
        if error == "not_found":
            return GrepResult(matches=[])
        if error:
            return GrepResult(error=str(error), matches=[])
        matches = [GrepMatch(path=m["path"], line=int(m["line"]), text=m["text"]) for m in found]
        if max_count is not None and len(matches) > max_count:
            return GrepResult(matches=matches[:max_count], truncated=True)
        return GrepResult(matches=matches)

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        found, error = self._script(op="glob", pattern=pattern, path=path or "/")
        if error == "not_found":
            return GlobResult(matches=[])
        if error:
            return GlobResult(error=str(error))
        return GlobResult(matches=sorted((_info(i, listing=False) for i in found), key=lambda e: e["path"]))


def _info(raw: dict[str, Any], listing: bool) -> FileInfo:
    path, is_dir = str(raw["path"]), bool(raw["is_dir"])
    if is_dir and listing and not path.endswith("/"):
        path += "/"
    return FileInfo(
        path=path,
        is_dir=is_dir,
        size=int(raw["size"]),
        modified_at=datetime.datetime.fromtimestamp(float(raw["mtime"])).isoformat(),
    )
