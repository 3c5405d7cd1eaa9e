"""The reference backend protocol's types (``deepagents.backends.protocol``): results as
dataclasses, entries as TypedDicts, and the abstract ``BackendProtocol`` and
``SandboxBackendProtocol`` a Python backend may subclass. Re-exported by
``deepagents_rs.backends.protocol``."""

from __future__ import annotations

import abc
import asyncio
import dataclasses
from typing import Any, Callable, Final, Literal, TypedDict

FileOperationError = Literal["file_not_found", "permission_denied", "is_directory", "invalid_path"]
"""The error codes of ``upload_files``/``download_files`` answers."""

FILE_NOT_FOUND: Final = "file_not_found"
PERMISSION_DENIED: Final = "permission_denied"
IS_DIRECTORY: Final = "is_directory"
INVALID_PATH: Final = "invalid_path"

DEFAULT_GREP_TIMEOUT: Final = 15
ASYNC_GREP_TIMEOUT: Final = 2 * DEFAULT_GREP_TIMEOUT + 5
ASYNC_GLOB_TIMEOUT: Final = 30

GlobTruncationReason = Literal["budget", "unreadable", "transport"]


class _FileInfoPath(TypedDict):
    path: str


class FileInfo(_FileInfoPath, total=False):
    """An entry of a listing or a glob: ``path`` (directories end in ``/`` in listings),
    and when known ``is_dir``, ``size`` (bytes) and ``modified_at`` (ISO 8601)."""

    is_dir: bool
    size: int
    modified_at: str


class ContextLine(TypedDict):
    """A line next to a grep match (1-based ``line``)."""

    line: int
    text: str


class _GrepLine(TypedDict):
    path: str
    line: int
    text: str


class GrepMatch(_GrepLine, total=False):
    """One matching line: its file, 1-based line number and text (context lines only when
    a backend was asked for them)."""

    context_before: list[ContextLine]
    context_after: list[ContextLine]


class _FileContent(TypedDict):
    content: str
    encoding: str


class FileData(_FileContent, total=False):
    """A stored file: ``content`` (text, or base64 when ``encoding`` is ``"base64"``) and
    ISO 8601 timestamps."""

    created_at: str
    modified_at: str


@dataclasses.dataclass
class FileDownloadResponse:
    """One file of ``download_files``: its bytes, or an error code."""

    path: str
    content: bytes | None = None
    error: FileOperationError | str | None = None


@dataclasses.dataclass
class FileUploadResponse:
    """One file of ``upload_files``: ``error`` is ``None`` when it was written."""

    path: str
    error: FileOperationError | str | None = None


@dataclasses.dataclass
class ReadResult:
    """A read window: ``file_data`` holds the raw text of lines ``start_line``..``end_line``
    (1-based) of ``total_lines``; ``next_offset`` is where the next page starts, ``None`` at
    the end. ``error`` instead on failure."""

    error: str | None = None
    file_data: FileData | None = None
    total_lines: int | None = None
    start_line: int | None = None
    end_line: int | None = None
    next_offset: int | None = None
    no_lines_requested: bool = False


@dataclasses.dataclass
class WriteResult:
    """``path`` of the written file, or ``error``."""

    error: str | None = None
    path: str | None = None


@dataclasses.dataclass
class EditResult:
    """``path`` and the number of replacements made, or ``error``."""

    error: str | None = None
    path: str | None = None
    occurrences: int | None = None


@dataclasses.dataclass
class DeleteResult:
    """``path`` of what was deleted, or ``error``."""

    error: str | None = None
    path: str | None = None


@dataclasses.dataclass
class LsResult:
    """A directory's entries, or ``error`` (then ``entries`` is ``None``)."""

    error: str | None = None
    entries: list[FileInfo] | None = None


@dataclasses.dataclass
class GrepResult:
    """Matches (possibly cut short: ``truncated``), or ``error``."""

    error: str | None = None
    matches: list[GrepMatch] | None = None
    truncated: bool = False


@dataclasses.dataclass
class GlobResult:
    """Matching files (possibly cut short: ``truncated``), or ``error``."""

    error: str | None = None
    matches: list[FileInfo] | None = None
    truncated: bool = False
    truncation_reason: GlobTruncationReason | None = None


@dataclasses.dataclass
class ExecuteResponse:
    """What a command printed (stdout and stderr together), its exit code (``None`` when
    unknown) and whether the output was cut."""

    output: str
    exit_code: int | None = None
    truncated: bool = False


class BackendProtocol(abc.ABC):  # noqa: B024 - every method is optional to override
    """Where an agent's files live. Subclass it and implement the operations your store
    supports; a method left as is raises ``NotImplementedError``. Paths are absolute
    (``/dir/file``). The ``a…`` methods run the plain ones on a worker thread unless
    overridden."""

    def ls(self, path: str) -> LsResult:
        """The entries directly under ``path``."""
        raise NotImplementedError

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        """Up to ``limit`` lines from line ``offset`` (0-based), unformatted."""
        raise NotImplementedError

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> GrepResult:
        """Lines containing ``pattern`` (literally) in files under ``path`` whose path
        matches ``glob``; at most ``max_count`` when given."""
        raise NotImplementedError

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        """Files under ``path`` matching ``pattern``."""
        raise NotImplementedError

    def write(self, file_path: str, content: str) -> WriteResult:
        """Creates or replaces ``file_path``."""
        raise NotImplementedError

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:
        """Replaces ``old_string`` (which must be unique unless ``replace_all``)."""
        raise NotImplementedError

    def delete(self, file_path: str) -> DeleteResult:
        """Removes a file, or a directory and everything under it (optional)."""
        raise NotImplementedError

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Writes each ``(path, bytes)``; one answer per file, in order."""
        raise NotImplementedError

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Reads each path as bytes; one answer per path, in order."""
        raise NotImplementedError

    async def als(self, path: str) -> LsResult:
        return await asyncio.to_thread(self.ls, path)

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return await asyncio.to_thread(self.read, file_path, offset, limit)

    async def agrep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> GrepResult:
        if max_count is None:
            return await asyncio.to_thread(self.grep, pattern, path, glob)
        return await asyncio.to_thread(lambda: self.grep(pattern, path, glob, max_count=max_count))

    async def aglob(self, pattern: str, path: str | None = None) -> GlobResult:
        return await asyncio.to_thread(self.glob, pattern, path)

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        return await asyncio.to_thread(self.write, file_path, content)

    async def aedit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:
        return await asyncio.to_thread(self.edit, file_path, old_string, new_string, replace_all)

    async def adelete(self, file_path: str) -> DeleteResult:
        return await asyncio.to_thread(self.delete, file_path)

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return await asyncio.to_thread(self.upload_files, files)

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return await asyncio.to_thread(self.download_files, paths)


class SandboxBackendProtocol(BackendProtocol):
    """A backend that also runs shell commands: the agent gets the ``execute`` tool."""

    @property
    def id(self) -> str:
        """A stable id of this sandbox."""
        raise NotImplementedError

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Runs ``command`` in the sandbox (``timeout`` seconds, the backend's default
        when ``None``)."""
        raise NotImplementedError

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        return await asyncio.to_thread(lambda: self.execute(command, timeout=timeout))


def execute_accepts_timeout(cls: type[SandboxBackendProtocol]) -> bool:
    """Whether ``cls.execute`` takes a ``timeout`` keyword."""
    import inspect

    try:
        return "timeout" in inspect.signature(cls.execute).parameters
    except (TypeError, ValueError):
        return False


BackendFactory = Callable[[Any], BackendProtocol]
"""A backend made from the runtime (``backend=lambda rt: …``, as earlier releases of the
reference took it); called once, when the agent is built."""
