"""Reference code with only the top package renamed: the module layout of LangChain's
``deepagents`` (``backends``, ``backends.protocol``, ``backends.utils``, ``graph``,
``middleware``), the protocol types, and the built-in backends' methods called directly."""

from __future__ import annotations

import base64
import datetime
import os
from pathlib import Path
from typing import Any

import pytest

from deepagents_rs import InMemoryStore, ScriptedModel, create_deep_agent
from deepagents_rs.backends import (
    DEFAULT_EXECUTE_TIMEOUT,
    BackendProtocol,
    CompositeBackend,
    FilesystemBackend,
    LocalShellBackend,
    StateBackend,
    StoreBackend,
)
from deepagents_rs.backends.sandbox import BaseSandbox
from deepagents_rs.backends.protocol import (
    EditResult,
    ExecuteResponse,
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
from deepagents_rs.backends.utils import (
    create_file_data,
    file_data_to_string,
    format_content_with_line_numbers,
    grep_matches_from_files,
    perform_string_replacement,
    slice_read_response,
    update_file_data,
    validate_path,
)


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "args": args}]}


def say(text: str) -> dict[str, Any]:
    return {"text": text}


# --- layout ------------------------------------------------------------------------------


def test_the_reference_import_paths_resolve() -> None:
    from deepagents_rs.backends.composite import CompositeBackend as Composite
    from deepagents_rs.backends.filesystem import FilesystemBackend as Filesystem
    from deepagents_rs.backends.local_shell import LocalShellBackend as LocalShell
    from deepagents_rs.backends.state import StateBackend as State
    from deepagents_rs.backends.store import StoreBackend as Store
    from deepagents_rs.graph import DeepAgentState, create_deep_agent as graph_create
    from deepagents_rs.middleware import CompiledSubAgent, FilesystemPermission, SubAgent
    from deepagents_rs.middleware.filesystem import FsToolName
    from deepagents_rs.middleware.subagents import SubAgent as SubAgentAgain

    import deepagents_rs

    assert (Composite, Filesystem, LocalShell, State, Store) == (
        CompositeBackend,
        FilesystemBackend,
        LocalShellBackend,
        StateBackend,
        StoreBackend,
    )
    assert graph_create is create_deep_agent and SubAgentAgain is SubAgent
    assert deepagents_rs.SubAgent is SubAgent and deepagents_rs.FilesystemPermission is FilesystemPermission
    assert DEFAULT_EXECUTE_TIMEOUT == 120
    assert DeepAgentState and CompiledSubAgent and FsToolName
    sub: SubAgent = {"name": "researcher", "description": "Looks things up.", "system_prompt": "Research."}
    agent = create_deep_agent(model=ScriptedModel([say("x")]), subagents=[sub])
    assert "task" in [t["name"] for t in agent.tools]


@pytest.mark.parametrize(
    ("module", "name", "hint"),
    [
        ("deepagents_rs.middleware", "FilesystemMiddleware", "backend="),
        ("deepagents_rs.middleware", "SubAgentMiddleware", "subagents="),
        ("deepagents_rs.middleware", "MemoryMiddleware", "memory="),
        ("deepagents_rs.middleware", "SkillsMiddleware", "skills="),
        ("deepagents_rs.middleware", "SummarizationMiddleware", "compacts"),
        ("deepagents_rs", "AsyncSubAgentMiddleware", "async subagents"),
        ("deepagents_rs.backends", "LangSmithSandbox", "LocalShellBackend"),
        ("deepagents_rs.middleware.skills", "SkillsMiddleware", "skills="),
        ("deepagents_rs.middleware.memory", "MemoryMiddleware", "memory="),
        ("deepagents_rs.middleware.summarization", "SummarizationMiddleware", "compacts"),
        ("deepagents_rs.middleware.async_subagents", "AsyncSubAgentMiddleware", "async subagents"),
    ],
)
def test_names_that_are_not_provided_fail_to_import_with_the_alternative(module: str, name: str, hint: str) -> None:
    with pytest.raises(ImportError, match=name) as error:
        exec(f"from {module} import {name}", {})
    assert hint in str(error.value)
    with pytest.raises(ImportError):
        exec("from deepagents_rs.middleware import NoSuchThing", {})


# --- FilesystemBackend called directly ---------------------------------------------------


def test_filesystem_backend_methods_work_on_its_root(tmp_path: Path) -> None:
    backend = FilesystemBackend(root_dir=tmp_path, virtual_mode=True)
    assert isinstance(backend, BackendProtocol)
    assert backend.write("/a.txt", "one\ntwo\none\n") == WriteResult(path="/a.txt")
    assert (tmp_path / "a.txt").read_text() == "one\ntwo\none\n"
    # Writing again replaces the file, as the reference's write does.
    assert backend.write("/a.txt", "one\ntwo\nthree\n").error is None

    read = backend.read("/a.txt")
    assert isinstance(read, ReadResult) and read.error is None and read.file_data is not None
    assert read.file_data == {"content": "one\ntwo\nthree\n", "encoding": "utf-8"}
    assert (read.start_line, read.end_line, read.total_lines, read.next_offset) == (1, 3, 3, None)
    page = backend.read("/a.txt", offset=1, limit=1)
    assert page.file_data is not None and page.file_data["content"] == "two\n"
    assert (page.start_line, page.end_line, page.next_offset) == (2, 2, 2)
    assert backend.read("/missing.txt").error == "File '/missing.txt' not found"

    assert backend.edit("/a.txt", "two", "2") == EditResult(path="/a.txt", occurrences=1)
    assert backend.edit("/a.txt", "zzz", "y").error == "Error: String not found in file: 'zzz'"
    backend.write("/b.txt", "x x x")
    not_unique = backend.edit("/b.txt", "x", "y").error
    assert not_unique is not None and "appears 3 times" in not_unique and "replace_all" in not_unique
    assert backend.edit("/b.txt", "x", "y", replace_all=True).occurrences == 3
    assert backend.edit("/nope.txt", "a", "b").error == "Error: File '/nope.txt' not found"
    assert backend.edit("/a.txt", "", "b").error is not None

    backend.write("/src/app/main.py", "print('hi')\n# TODO: more\n")
    listing = backend.ls("/")
    assert isinstance(listing, LsResult) and listing.error is None and listing.entries is not None
    paths = [e["path"] for e in listing.entries]
    assert paths == ["/a.txt", "/b.txt", "/src/"]
    first = listing.entries[0]
    assert first["is_dir"] is False and first["size"] == len("one\n2\nthree\n")
    datetime.datetime.fromisoformat(first["modified_at"])
    assert backend.ls("/nope").error == "Path '/nope': path_not_found"
    assert backend.ls("/a.txt").error == "Path '/a.txt': not_a_directory"
    assert backend.ls("/src").entries == [e for e in backend.ls("/src/").entries or []]

    found = backend.grep("TODO", "/")
    assert isinstance(found, GrepResult)
    assert found.matches == [{"path": "/src/app/main.py", "line": 2, "text": "# TODO: more"}]
    assert backend.grep("one", "/", "*.py").matches == []
    assert backend.grep("one", "/", "*.txt").matches == [{"path": "/a.txt", "line": 1, "text": "one"}]
    assert backend.grep("x", "/nowhere").matches == []

    globbed = backend.glob("**/*.py")
    assert isinstance(globbed, GlobResult)
    assert [m["path"] for m in globbed.matches or []] == ["/src/app/main.py"]
    assert [m["path"] for m in backend.glob("*.txt", "/").matches or []] == ["/a.txt", "/b.txt"]

    # The names of earlier releases.
    assert [i["path"] for i in backend.ls_info("/")] == paths
    assert backend.grep_raw("TODO") == found.matches
    assert [i["path"] for i in backend.glob_info("*.py")] == ["/src/app/main.py"]

    assert backend.delete("/b.txt").error is None and not (tmp_path / "b.txt").exists()
    assert backend.delete("/b.txt").error == "Error: '/b.txt' not found"


def test_virtual_mode_confines_paths_and_non_virtual_mode_takes_host_paths(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "outside.txt").write_text("secret")
    confined = FilesystemBackend(root_dir=tmp_path / "root", virtual_mode=True)
    assert confined.read("/../outside.txt").error is not None
    assert confined.write("relative.txt", "r").error is None  # read as /relative.txt
    assert (tmp_path / "root" / "relative.txt").read_text() == "r"

    host = FilesystemBackend(root_dir=tmp_path / "root", virtual_mode=False)
    read = host.read(str(tmp_path / "outside.txt"))
    assert read.file_data is not None and read.file_data["content"] == "secret"
    assert host.write("rel.txt", "under the root").error is None
    assert (tmp_path / "root" / "rel.txt").read_text() == "under the root"
    assert str(tmp_path / "outside.txt") in [e["path"] for e in host.ls(str(tmp_path)).entries or []]


def test_bytes_empty_files_uploads_and_downloads(tmp_path: Path) -> None:
    backend = FilesystemBackend(root_dir=tmp_path)
    png = b"\x89PNG\r\n\x1a\n\x00\x01"
    (tmp_path / "pic.png").write_bytes(png)
    (tmp_path / "empty.txt").write_text("")
    read = backend.read("/pic.png")
    assert read.file_data == {"content": base64.standard_b64encode(png).decode(), "encoding": "base64"}
    empty = backend.read("/empty.txt")
    assert empty.error is None and empty.file_data is not None and "empty" in empty.file_data["content"]

    assert backend.upload_files([("/up.txt", b"uploaded")]) == [FileUploadResponse(path="/up.txt")]
    assert (tmp_path / "up.txt").read_bytes() == b"uploaded"
    assert backend.download_files(["/pic.png", "/none"]) == [
        FileDownloadResponse(path="/pic.png", content=png),
        FileDownloadResponse(path="/none", error="file_not_found"),
    ]


def test_a_file_too_large_to_read_whole_is_read_by_pages(tmp_path: Path) -> None:
    (tmp_path / "big.log").write_text("".join(f"line {i} {'x' * 100}\n" for i in range(110_000)))  # > 10 MiB
    backend = FilesystemBackend(root_dir=tmp_path)
    page = backend.read("/big.log", offset=5, limit=2)
    assert page.file_data is not None and page.file_data["content"].splitlines()[0].startswith("line 5 ")
    assert (page.start_line, page.end_line, page.total_lines, page.next_offset) == (6, 7, 110_000, 7)


def test_local_shell_backend_executes_in_its_root(tmp_path: Path) -> None:
    backend = LocalShellBackend(root_dir=tmp_path, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert isinstance(backend, SandboxBackendProtocol) and backend.id.startswith("local-")
    backend.write("/hello.txt", "hi there\n")
    done = backend.execute("cat hello.txt")
    assert isinstance(done, ExecuteResponse)
    assert (done.output, done.exit_code, done.truncated) == ("hi there\n", 0, False)
    failed = backend.execute("echo oops >&2; exit 3")
    assert failed.exit_code == 3 and "oops" in failed.output and failed.output.endswith("Exit code: 3")
    assert backend.execute("").exit_code == 1
    with pytest.raises(ValueError):
        backend.execute("true", timeout=0)


# --- the other backends outside a run ----------------------------------------------------


def test_store_backend_with_its_store_works_directly_and_in_an_agent() -> None:
    store = InMemoryStore()
    backend = StoreBackend(store=store, namespace=("memories",))
    assert backend.write("/prefs.md", "likes tea\n").error is None
    read = backend.read("/prefs.md")
    assert read.file_data is not None and read.file_data["content"] == "likes tea\n"
    # The agent gets no store= of its own: the backend's store serves its file tools.
    model = ScriptedModel([call("read_file", file_path="/prefs.md"), say("ok")])
    result = create_deep_agent(model=model, backend=backend).invoke({"messages": "go"})
    assert "likes tea" in [m.content for m in result["messages"] if m.type == "tool"][0]
    with pytest.raises(ValueError, match="store"):
        StoreBackend().read("/x")


def test_a_store_namespace_may_be_a_function_of_the_runtime() -> None:
    store = InMemoryStore()
    seen: list[Any] = []

    def per_user(rt: Any) -> tuple[str, ...]:
        seen.append(rt)
        return ("users", rt.context["user"] if rt.context else "nobody")

    backend = StoreBackend(namespace=per_user, store=store)
    assert backend.write("/direct.md", "outside a run").error is None
    assert seen[-1].context is None and seen[-1].store is store
    # In a run the function sees invoke's context=; each user gets their own files.
    model = ScriptedModel([call("write_file", file_path="/me.md", content="ada's"), say("ok")])
    agent = create_deep_agent(model=model, backend=backend)
    agent.invoke({"messages": "go"}, context={"user": "ada"})
    assert seen[-1].context == {"user": "ada"}
    assert StoreBackend(namespace=("users", "ada"), store=store).read("/me.md").error is None
    assert StoreBackend(namespace=("users", "bob"), store=store).read("/me.md").error is not None
    assert StoreBackend(namespace=("users", "nobody"), store=store).read("/direct.md").error is None


def test_state_and_composite_backends_outside_a_run_keep_a_scratch_state(tmp_path: Path) -> None:
    disk = FilesystemBackend(root_dir=tmp_path)
    composite = CompositeBackend(default=StateBackend(), routes={"/disk/": disk})
    assert composite.write("/notes.md", "in state").error is None
    assert composite.write("/disk/d.txt", "on disk").error is None
    assert (tmp_path / "d.txt").read_text() == "on disk"
    assert [e["path"] for e in composite.ls("/").entries or []] == ["/disk/", "/notes.md"]
    read = composite.read("/notes.md")
    assert read.file_data is not None and read.file_data["content"] == "in state"
    assert composite.grep("disk", "/").matches == [{"path": "/disk/d.txt", "line": 1, "text": "on disk"}]
    # Each object keeps its own scratch state; none is any thread's.
    assert StateBackend().read("/notes.md").error is not None


def test_a_backend_factory_of_earlier_releases_is_called_once(tmp_path: Path) -> None:
    store = InMemoryStore()
    StoreBackend(namespace=("filesystem",), store=store).write("/prefs.md", "tea")
    model = ScriptedModel([call("read_file", file_path="/memories/prefs.md"), say("ok")])
    agent = create_deep_agent(
        model=model,
        store=store,
        backend=lambda rt: CompositeBackend(default=StateBackend(rt), routes={"/memories/": StoreBackend(rt)}),
    )
    result = agent.invoke({"messages": "go"})
    assert "tea" in [m.content for m in result["messages"] if m.type == "tool"][0]


# --- a custom BackendProtocol ------------------------------------------------------------


class DictBackend(BackendProtocol):
    """A backend written as the reference's users write one: protocol results throughout."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {"/seed.txt": "alpha\nbeta\n"}

    def ls(self, path: str) -> LsResult:
        if path.rstrip("/") and not any(p.startswith(path.rstrip("/") + "/") for p in self.files):
            return LsResult(error=f"Path '{path}': path_not_found")
        return LsResult(entries=[FileInfo(path=p, is_dir=False, size=len(c)) for p, c in self.files.items()])

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        if file_path not in self.files:
            return ReadResult(error=f"File '{file_path}' not found")
        return slice_read_response(create_file_data(self.files[file_path]), offset, limit)

    def write(self, file_path: str, content: str) -> WriteResult:
        self.files[file_path] = content
        return WriteResult(path=file_path)

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:
        if file_path not in self.files:
            return EditResult(error=f"Error: File '{file_path}' not found")
        done = perform_string_replacement(self.files[file_path], old_string, new_string, replace_all)
        if isinstance(done, str):
            return EditResult(error=done)
        self.files[file_path], count = done
        return EditResult(path=file_path, occurrences=count)

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> GrepResult:
        return GrepResult(
            matches=[
                GrepMatch(path=p, line=i + 1, text=line)
                for p, c in self.files.items()
                for i, line in enumerate(c.splitlines())
                if pattern in line
            ]
        )

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        suffix = pattern.lstrip("*")
        return GlobResult(matches=[FileInfo(path=p, is_dir=False) for p in self.files if p.endswith(suffix)])


def test_a_backend_protocol_subclass_serves_an_agents_file_tools() -> None:
    backend = DictBackend()
    model = ScriptedModel([
        call("read_file", file_path="/seed.txt"),
        call("write_file", file_path="/new.txt", content="one two"),
        call("edit_file", file_path="/new.txt", old_string="two", new_string="three"),
        call("edit_file", file_path="/new.txt", old_string="zzz", new_string="y"),
        call("grep", pattern="beta", output_mode="content"),
        call("glob", pattern="*.txt"),
        call("ls", path="/"),
        call("read_file", file_path="/missing.txt"),
        call("ls", path="/nope"),
        say("done"),
    ])
    result = create_deep_agent(model=model, backend=backend).invoke({"messages": "go"})
    outputs = [m for m in result["messages"] if m.type == "tool"]
    assert outputs[8].status == "error" and "does not exist" in outputs[8].content
    assert "alpha" in outputs[0].content and "beta" in outputs[0].content
    assert backend.files["/new.txt"] == "one three"
    assert outputs[3].status == "error"
    assert "/seed.txt" in outputs[4].content and "beta" in outputs[4].content
    assert "/new.txt" in outputs[5].content and "/seed.txt" in outputs[6].content
    assert outputs[7].status == "error"


# --- BaseSandbox -------------------------------------------------------------------------


class SubprocessSandbox(BaseSandbox):
    """A sandbox provider's subclass in miniature: the four methods a subclass writes, on
    this machine (its filesystem is the host's)."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd

    @property
    def id(self) -> str:
        return "sub-1"

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        import subprocess

        done = subprocess.run(command, shell=True, cwd=self.cwd, capture_output=True, text=True, timeout=timeout or 60)
        return ExecuteResponse(output=done.stdout + done.stderr, exit_code=done.returncode)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        for path, data in files:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_bytes(data)
        return [FileUploadResponse(path=p) for p, _ in files]

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return [
            FileDownloadResponse(path=p, content=Path(p).read_bytes())
            if Path(p).is_file()
            else FileDownloadResponse(path=p, error="file_not_found")
            for p in paths
        ]


def test_a_base_sandbox_subclass_gets_the_file_operations(tmp_path: Path) -> None:
    sandbox = SubprocessSandbox(tmp_path)
    root = str(tmp_path)
    assert sandbox.write(f"{root}/src/a.py", "x = 1\n# TODO\n").error is None
    read = sandbox.read(f"{root}/src/a.py")
    assert read.file_data is not None and read.file_data["content"] == "x = 1\n# TODO\n"
    assert sandbox.edit(f"{root}/src/a.py", "x = 1", "x = 2").occurrences == 1
    assert sandbox.edit(f"{root}/src/a.py", "nope", "y").error == "Error: String not found in file: 'nope'"
    assert sandbox.read(f"{root}/none.txt").error == f"File '{root}/none.txt' not found"
    assert [e["path"] for e in sandbox.ls(root).entries or []] == [f"{root}/src/"]
    assert sandbox.ls(root + "/missing").error == f"Path '{root}/missing': path_not_found"
    assert [m["path"] for m in sandbox.glob("*.py", root).matches or []] == [f"{root}/src/a.py"]
    assert [m["path"] for m in sandbox.glob("src/*.py", root).matches or []] == [f"{root}/src/a.py"]
    assert sandbox.glob("*.txt", root).matches == []
    assert sandbox.grep("TODO", root).matches == [{"path": f"{root}/src/a.py", "line": 2, "text": "# TODO"}]
    assert sandbox.grep("TODO", root, "*.md").matches == []
    assert sandbox.delete(root + "/src").error is None and not (tmp_path / "src").exists()
    assert sandbox.delete(root + "/src").error == f"Error: '{root}/src' not found"
    model = ScriptedModel([call("execute", command="echo from-the-sandbox"), say("ok")])
    result = create_deep_agent(model=model, backend=sandbox).invoke({"messages": "go"})
    assert "from-the-sandbox" in [m.content for m in result["messages"] if m.type == "tool"][0]


def test_a_composite_called_directly_routes_to_a_python_backend(tmp_path: Path) -> None:
    import asyncio

    mine = DictBackend()
    composite = CompositeBackend(default=FilesystemBackend(root_dir=tmp_path), routes={"/mem/": mine})
    assert composite.write("/mem/note.md", "no newline").error is None
    assert mine.files["/note.md"] == "no newline"
    read = asyncio.run(composite.aread("/mem/note.md"))
    assert read.file_data is not None and read.file_data["content"] == "no newline"
    assert "/mem/seed.txt" in [e["path"] for e in composite.ls("/mem/").entries or []]


# --- utils -------------------------------------------------------------------------------


def test_file_data_helpers_have_the_reference_shape() -> None:
    data = create_file_data("hello\nworld")
    assert set(data) == {"content", "encoding", "created_at", "modified_at"}
    assert data["content"] == "hello\nworld" and data["encoding"] == "utf-8"
    created = datetime.datetime.fromisoformat(data["created_at"])
    assert created.tzinfo is not None
    assert create_file_data("x", created_at="2020-01-01T00:00:00+00:00")["created_at"] == "2020-01-01T00:00:00+00:00"
    assert create_file_data("aGk=", encoding="base64")["encoding"] == "base64"
    updated = update_file_data(data, "new")
    assert updated["content"] == "new" and updated["created_at"] == data["created_at"]
    assert file_data_to_string({"content": ["a", "b"], "encoding": "utf-8"}) == "a\nb"
    assert format_content_with_line_numbers("a\nb\n") == "1  a\n2  b"
    assert format_content_with_line_numbers(["x"] * 10, start_line=5).splitlines()[0] == " 5  x"
    assert perform_string_replacement("a b a", "a", "c", True) == ("c b c", 2)
    assert validate_path("a//b/") == "/a/b/" and validate_path("/m/x", allowed_prefixes=["/m/"]) == "/m/x"
    for bad in ("/../etc/passwd", "~/x", "C:/x"):
        with pytest.raises(ValueError):
            validate_path(bad)
    files = {"/a.txt": create_file_data("one\nTODO two"), "/src/b.py": create_file_data("# TODO")}
    assert grep_matches_from_files(files, "TODO", "/src", "*.py").matches == [{"path": "/src/b.py", "line": 1, "text": "# TODO"}]
    capped = grep_matches_from_files(files, "TODO", max_count=1)
    assert capped.truncated and capped.matches == [{"path": "/a.txt", "line": 2, "text": "TODO two"}]
