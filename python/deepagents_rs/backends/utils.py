"""Small helpers the reference's users call (``deepagents.backends.utils``): file data
records, line-numbered views, exact string replacement."""

from __future__ import annotations

import datetime
import re
from typing import Any, Callable, Mapping, Sequence

from .._backends import EMPTY_CONTENT_WARNING, EMPTY_OLD_STRING_ERROR, slice_lines
from .._protocol import FileData, GrepMatch, GrepResult, ReadResult

MAX_LINE_LENGTH = 5000
"""Longer lines are shown in pieces (``12.1``, ``12.2``) by ``format_content_with_line_numbers``."""

__all__ = [
    "EMPTY_CONTENT_WARNING",
    "EMPTY_OLD_STRING_ERROR",
    "MAX_LINE_LENGTH",
    "check_empty_content",
    "create_file_data",
    "file_data_to_string",
    "format_content_with_line_numbers",
    "grep_matches_from_files",
    "normalize_read_bounds",
    "perform_string_replacement",
    "slice_read_response",
    "update_file_data",
    "validate_path",
]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def create_file_data(content: str, created_at: str | None = None, encoding: str = "utf-8") -> FileData:
    """A new file record: ``content``, ``encoding`` and both timestamps (now, unless
    ``created_at`` is given)."""
    now = _now()
    return FileData(content=content, encoding=encoding, created_at=created_at or now, modified_at=now)


def update_file_data(file_data: FileData, content: str) -> FileData:
    """``file_data`` with new ``content``: same encoding and creation time, modified now."""
    updated = FileData(content=content, encoding=file_data.get("encoding", "utf-8"))
    if "created_at" in file_data:
        updated["created_at"] = file_data["created_at"]
    updated["modified_at"] = _now()
    return updated


def file_data_to_string(file_data: FileData | dict[str, Any]) -> str:
    """The content of a file record as one string (older records hold a list of lines)."""
    content: Any = file_data["content"]
    if isinstance(content, list):
        return "\n".join(str(line) for line in content)
    if not isinstance(content, str):
        raise TypeError(f"file content is a string (or a list of lines), not {type(content).__name__}")
    return content


def check_empty_content(content: str) -> str | None:
    """The reminder shown for an empty (or blank) file, or ``None``."""
    return EMPTY_CONTENT_WARNING if not content.strip() else None


def format_content_with_line_numbers(content: str | list[str], start_line: int = 1) -> str:
    """``content`` with a line number before each line (right-aligned, two spaces after);
    lines over ``MAX_LINE_LENGTH`` characters continue on rows numbered ``N.1``, ``N.2``…"""
    if isinstance(content, str):
        lines = content.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
    else:
        lines = list(content)
    rows: list[tuple[str, str]] = []
    for number, line in enumerate(lines, start_line):
        pieces = [line[i : i + MAX_LINE_LENGTH] for i in range(0, len(line), MAX_LINE_LENGTH)] or [line]
        rows.extend((str(number) if i == 0 else f"{number}.{i}", piece) for i, piece in enumerate(pieces))
    width = max((len(marker) for marker, _ in rows), default=0)
    return "\n".join(f"{marker:>{width}}  {piece}" for marker, piece in rows)


def normalize_read_bounds(offset: int, limit: int) -> tuple[int, int]:
    """``offset`` and ``limit`` as integers, neither below zero."""
    return max(int(offset), 0), max(int(limit), 0)


def slice_read_response(file_data: FileData, offset: int, limit: int) -> ReadResult:
    """The read window of ``limit`` lines from ``offset`` (0-based) of a file record, raw,
    with its line range (``start_line``, ``end_line``, ``total_lines``, ``next_offset``)."""
    result = slice_lines(file_data_to_string(file_data), offset, limit)
    if result.file_data is not None:
        window = FileData(content=result.file_data["content"], encoding=file_data.get("encoding", "utf-8"))
        for key in ("created_at", "modified_at"):
            if key in file_data:
                window[key] = file_data[key]
        result.file_data = window
    return result


def perform_string_replacement(
    content: str, old_string: str, new_string: str, replace_all: bool = False
) -> tuple[str, int] | str:
    """``(new content, occurrences)``, or an error message when ``old_string`` is empty,
    absent, or occurs more than once without ``replace_all``."""
    if not old_string:
        return EMPTY_OLD_STRING_ERROR
    count = content.count(old_string)
    if count == 0:
        return f"Error: String not found in file: '{old_string}'"
    if count > 1 and not replace_all:
        return (
            f"Error: String '{old_string}' appears {count} times in file. Use replace_all=True to replace"
            " all instances, or provide a more specific string with surrounding context."
        )
    return content.replace(old_string, new_string), count


def validate_path(path: str, *, allowed_prefixes: Sequence[str] | None = None) -> str:
    """``path`` as a virtual path (forward slashes, one leading ``/``); ``ValueError`` for
    ``..`` or ``~`` segments, drive letters, or a path outside ``allowed_prefixes``."""
    if re.match(r"^[A-Za-z]:[/\\]", path):
        raise ValueError(f"Windows absolute paths are not virtual paths: {path}")
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." or p.startswith("~") for p in parts):
        raise ValueError(f"Path traversal not allowed: {path}")
    normalized = "/" + "/".join(parts)
    if path.endswith("/") and normalized != "/":
        normalized += "/"
    if allowed_prefixes is not None and not any(normalized.startswith(p) for p in allowed_prefixes):
        raise ValueError(f"Path must start with one of {list(allowed_prefixes)}: {path}")
    return normalized


def _glob_matcher(pattern: str) -> Callable[[str], bool]:
    """Matches a path relative to the search root: a pattern with ``/`` against the whole
    path (``**`` spans directories), one without against the file name."""
    out, i = "", 0
    body = pattern.lstrip("/")
    while i < len(body):
        if body.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
            continue
        if body.startswith("**", i):
            out, i = out + ".*", i + 2
            continue
        c = body[i]
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[" and "]" in body[i + 1 :]:
            j = body.index("]", i + 1)
            inner = body[i + 1 : j]
            out += "[" + ("^" + inner[1:] if inner.startswith("!") else inner) + "]"
            i = j
        else:
            out += re.escape(c)
        i += 1
    compiled = re.compile(out + r"\Z")
    if "/" in body:
        return lambda rel: compiled.match(rel) is not None
    return lambda rel: compiled.match(rel.rsplit("/", 1)[-1]) is not None


def grep_matches_from_files(
    files: Mapping[str, Any], pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
) -> GrepResult:
    """Lines containing ``pattern`` (literally) in a ``{path: FileData}`` mapping, under
    ``path``, in files whose path relative to it matches ``glob``; at most ``max_count``
    (then ``truncated``). Base64 files are skipped."""
    try:
        base = validate_path(path or "/")
    except ValueError:
        return GrepResult(matches=[])
    prefix = base if base.endswith("/") else base + "/"
    matcher = _glob_matcher(glob) if glob else None
    matches: list[GrepMatch] = []
    for file_path in sorted(files):
        data = files[file_path]
        if file_path != base and not file_path.startswith(prefix):
            continue
        relative = file_path[len(prefix) :] if file_path.startswith(prefix) else file_path.rsplit("/", 1)[-1]
        if matcher is not None and not matcher(relative):
            continue
        if data.get("encoding") == "base64":
            continue
        for number, line in enumerate(file_data_to_string(data).split("\n"), 1):
            if pattern in line:
                if max_count is not None and len(matches) >= max_count:
                    return GrepResult(matches=matches, truncated=True)
                matches.append(GrepMatch(path=file_path, line=number, text=line))
    return GrepResult(matches=matches)
