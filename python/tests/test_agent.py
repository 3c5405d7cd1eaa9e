"""The Python API end to end, with the scripted model and a local mock server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import threading
from pathlib import Path
from typing import Any, Literal, Optional

import pytest
from pydantic import BaseModel

from deepagents_rs import (
    AgentError,
    Command,
    CompositeBackend,
    FilesystemBackend,
    FilesystemPermission,
    InMemorySaver,
    InMemoryStore,
    InvalidRequest,
    LocalShellBackend,
    ScriptedModel,
    SpendCapExceeded,
    SqliteSaver,
    StateBackend,
    StoreBackend,
    ToolRuntime,
    create_deep_agent,
)


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "args": args}]}


def say(text: str) -> dict[str, Any]:
    return {"text": text}


def tool_results(result: dict[str, Any]) -> list[str]:
    return [m.content for m in result["messages"] if m.type == "tool"]


# --- tools -------------------------------------------------------------------------------


def test_a_ten_line_script_with_a_python_tool_runs() -> None:
    def get_weather(city: str) -> str:
        """Get the weather for a city."""
        return f"Sunny in {city}"

    model = ScriptedModel([call("get_weather", city="Paris"), say("Sunny in Paris.")])
    agent = create_deep_agent(model=model, tools=[get_weather], system_prompt="Be brief.")
    result = agent.invoke({"messages": [{"role": "user", "content": "Weather in Paris?"}]})
    assert result["messages"][-1].content == "Sunny in Paris."
    assert result["messages"][-1].type == "ai"
    assert tool_results(result) == ["Sunny in Paris"]
    call_message = result["messages"][1]
    assert call_message.tool_calls[0]["name"] == "get_weather"
    assert call_message.tool_calls[0]["args"] == {"city": "Paris"}
    assert result["messages"][2].tool_call_id == call_message.tool_calls[0]["id"]


class Point(BaseModel):
    x: int
    y: int


@dataclasses.dataclass
class Window:
    start: str
    end: str = "now"


def test_schemas_come_from_type_hints_and_the_docstring() -> None:
    def search(
        query: str,
        limit: int = 5,
        tags: list[str] | None = None,
        mode: Literal["fast", "deep"] = "fast",
        near: Optional[Point] = None,
        window: Window | None = None,
        ratio: float = 0.5,
        exact: bool = False,
        runtime: ToolRuntime | None = None,
    ) -> str:
        """Search the notes.

        Longer text that the model does not need.

        Args:
            query: What to look for.
            limit: How many results at most.
        """
        return ""

    agent = create_deep_agent(model=ScriptedModel([say("x")]), tools=[search])
    spec = next(t for t in agent.tools if t["name"] == "search")
    assert spec["description"] == "Search the notes."
    params = spec["parameters"]
    assert params["required"] == ["query"]
    props = params["properties"]
    assert "runtime" not in props
    assert props["query"] == {"type": "string", "description": "What to look for."}
    assert props["limit"]["type"] == "integer" and props["limit"]["default"] == 5
    assert props["limit"]["description"] == "How many results at most."
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "default": None}
    assert props["mode"]["enum"] == ["fast", "deep"]
    assert props["near"]["properties"]["x"]["type"] == "integer"
    assert props["window"]["required"] == ["start"]
    assert props["ratio"]["type"] == "number" and props["exact"]["type"] == "boolean"


def test_pydantic_arguments_arrive_as_models() -> None:
    seen: list[Any] = []

    def plot(point: Point) -> str:
        """Plot a point."""
        seen.append(point)
        return str(point.x + point.y)

    model = ScriptedModel([call("plot", point={"x": 2, "y": 3}), say("done")])
    result = create_deep_agent(model=model, tools=[plot]).invoke({"messages": "plot it"})
    assert isinstance(seen[0], Point)
    assert tool_results(result) == ["5"]


def test_exceptions_become_error_results_and_the_run_goes_on() -> None:
    def flaky(n: int) -> str:
        """Fails."""
        raise ValueError(f"bad n {n}")

    model = ScriptedModel([call("flaky", n=3), say("recovered")])
    result = create_deep_agent(model=model, tools=[flaky]).invoke({"messages": "go"})
    tool = [m for m in result["messages"] if m.type == "tool"][0]
    assert "ValueError: bad n 3" in tool.content
    assert tool.status == "error"
    assert result["messages"][-1].content == "recovered"


def test_malformed_arguments_reach_the_model_not_the_function() -> None:
    calls: list[Any] = []

    def add(a: int, b: int) -> int:
        """Adds."""
        calls.append((a, b))
        return a + b

    model = ScriptedModel([call("add", a="one"), say("ok")])
    result = create_deep_agent(model=model, tools=[add]).invoke({"messages": "add"})
    assert calls == []
    assert result["messages"][2].status == "error"
    assert result["messages"][-1].content == "ok"


def test_async_tools_run_on_an_event_loop_and_return_values_are_serialized() -> None:
    async def fetch(key: str) -> dict[str, Any]:
        """Fetches a record."""
        await asyncio.sleep(0.01)
        return {"key": key, "loop": asyncio.get_running_loop() is not None}

    model = ScriptedModel([call("fetch", key="k1"), say("ok")])
    result = create_deep_agent(model=model, tools=[fetch]).invoke({"messages": "go"})
    assert json.loads(tool_results(result)[0]) == {"key": "k1", "loop": True}


def test_parallel_tool_calls_run_concurrently_without_blocking_each_other() -> None:
    barrier = threading.Barrier(2, timeout=10)

    def wait(tag: str) -> str:
        """Waits for its sibling."""
        barrier.wait()
        return tag

    turn = {"tool_calls": [{"name": "wait", "args": {"tag": "a"}}, {"name": "wait", "args": {"tag": "b"}}]}
    result = create_deep_agent(model=ScriptedModel([turn, say("both")]), tools=[wait]).invoke({"messages": "go"})
    assert sorted(tool_results(result)) == ["a", "b"]


def test_the_runtime_brings_context_state_and_the_call_id() -> None:
    @dataclasses.dataclass
    class Context:
        user_id: str

    seen: dict[str, Any] = {}

    def whoami(runtime: ToolRuntime) -> str:
        """Says who the user is."""
        seen["call"] = runtime.tool_call_id
        seen["first"] = runtime.state["messages"][0].content
        seen["thread"] = runtime.config["configurable"].get("thread_id")
        return runtime.context.user_id

    agent = create_deep_agent(model=ScriptedModel([call("whoami"), say("ok")]), tools=[whoami], checkpointer=InMemorySaver())
    result = agent.invoke({"messages": "who am I"}, {"configurable": {"thread_id": "t-ctx"}}, context=Context("u-42"))
    assert tool_results(result) == ["u-42"]
    assert seen == {"call": "call_0_0", "first": "who am I", "thread": "t-ctx"}


# --- backends ----------------------------------------------------------------------------


def test_state_files_come_back_in_the_result() -> None:
    model = ScriptedModel([call("write_file", file_path="/notes.md", content="hello\n"), say("saved")])
    result = create_deep_agent(model=model).invoke({"messages": "save"})
    assert result["files"]["/notes.md"]["content"] == "hello\n"
    assert "todos" in result


def test_filesystem_backend_writes_under_its_root_and_refuses_escapes(tmp_path: Path) -> None:
    model = ScriptedModel([
        call("write_file", file_path="/a/b.txt", content="disk"),
        call("read_file", file_path="/../../etc/passwd"),
        say("done"),
    ])
    result = create_deep_agent(model=model, backend=FilesystemBackend(root_dir=tmp_path, virtual_mode=True)).invoke({"messages": "go"})
    assert (tmp_path / "a" / "b.txt").read_text() == "disk"
    results = [m for m in result["messages"] if m.type == "tool"]
    assert results[1].status == "error"
    assert "/a/b.txt" not in result["files"]


def test_local_shell_backend_runs_commands(tmp_path: Path) -> None:
    model = ScriptedModel([call("execute", command="echo hi > out.txt && cat out.txt"), say("ran")])
    agent = create_deep_agent(model=model, backend=LocalShellBackend(root_dir=tmp_path))
    assert "execute" in [t["name"] for t in agent.tools]
    result = agent.invoke({"messages": "run"})
    assert "hi" in tool_results(result)[0]
    assert (tmp_path / "out.txt").read_text().strip() == "hi"


def test_composite_routes_by_prefix_and_store_backend_is_shared_across_threads(tmp_path: Path) -> None:
    backend = CompositeBackend(default=StateBackend(), routes={"/memories/": StoreBackend(), "/disk/": FilesystemBackend(root_dir=tmp_path)})
    write = ScriptedModel([
        call("write_file", file_path="/memories/pref.md", content="likes tea"),
        call("write_file", file_path="/disk/x.txt", content="on disk"),
        call("write_file", file_path="/scratch.md", content="state"),
        say("saved"),
    ])
    store = InMemoryStore()
    first = create_deep_agent(model=write, backend=backend, store=store).invoke({"messages": "save"})
    assert (tmp_path / "x.txt").read_text() == "on disk"
    assert "/scratch.md" in first["files"] and "/memories/pref.md" not in first["files"]
    read = ScriptedModel([call("read_file", file_path="/memories/pref.md"), say("read")])
    second = create_deep_agent(model=read, backend=backend, store=store).invoke({"messages": "recall"})
    assert "likes tea" in tool_results(second)[0]


def test_store_backend_without_a_store_is_refused() -> None:
    with pytest.raises(ValueError, match="store=InMemoryStore"):
        create_deep_agent(model=ScriptedModel([say("x")]), backend=StoreBackend())


class DictBackend:
    """A backend in the reference protocol's shape, over a dict."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {"/seed.txt": "alpha\nbeta\n"}

    def ls_info(self, path: str) -> list[dict[str, Any]]:
        return [{"path": p, "is_dir": False, "size": len(c)} for p, c in self.files.items() if p.startswith(path)]

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> str:
        if file_path not in self.files:
            return f"Error: File '{file_path}' not found"
        lines = self.files[file_path].splitlines()[offset : offset + limit]
        return "\n".join(f"{i + offset + 1:6d}\t{line}" for i, line in enumerate(lines))

    def write(self, file_path: str, content: str) -> dict[str, Any]:
        if file_path in self.files:
            return {"error": f"Cannot write to {file_path} because it already exists."}
        self.files[file_path] = content
        return {"path": file_path, "error": None}

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> dict[str, Any]:
        text = self.files[file_path]
        count = text.count(old_string)
        if count == 0:
            return {"error": f"Error: String not found in file: '{old_string}'"}
        self.files[file_path] = text.replace(old_string, new_string)
        return {"path": file_path, "occurrences": count, "error": None}

    def glob_info(self, pattern: str, path: str = "/") -> list[dict[str, Any]]:
        suffix = pattern.lstrip("*")
        return [{"path": p, "is_dir": False} for p in self.files if p.endswith(suffix)]

    def grep_raw(self, pattern: str, path: str | None = None, glob: str | None = None) -> list[dict[str, Any]]:
        return [{"path": p, "line": i + 1, "text": line} for p, c in self.files.items() for i, line in enumerate(c.splitlines()) if pattern in line]


def test_a_python_backend_with_the_reference_method_names_serves_the_file_tools() -> None:
    backend = DictBackend()
    model = ScriptedModel([
        call("read_file", file_path="/seed.txt"),
        call("write_file", file_path="/new.txt", content="one two"),
        call("write_file", file_path="/new.txt", content="again"),
        call("edit_file", file_path="/new.txt", old_string="two", new_string="three"),
        call("edit_file", file_path="/new.txt", old_string="zzz", new_string="y"),
        call("grep", pattern="beta", output_mode="content"),
        call("glob", pattern="*.txt"),
        call("read_file", file_path="/missing.txt"),
        say("done"),
    ])
    result = create_deep_agent(model=model, backend=backend).invoke({"messages": "go"})
    outputs = [m for m in result["messages"] if m.type == "tool"]
    # The backend's own `cat -n` numbering is read through, not numbered twice.
    assert outputs[0].content.splitlines()[:2] == ["     1\talpha", "     2\tbeta"]
    assert backend.files["/new.txt"] == "one three"
    assert outputs[2].status == "error" and "already exists" in outputs[2].content
    assert outputs[4].status == "error"
    assert "/seed.txt" in outputs[5].content and "beta" in outputs[5].content
    assert "/new.txt" in outputs[6].content
    assert outputs[7].status == "error" and "does not exist" in outputs[7].content


def test_an_object_that_is_not_a_backend_is_refused_with_what_is_missing() -> None:
    with pytest.raises(TypeError, match="not a backend"):
        create_deep_agent(model=ScriptedModel([say("x")]), backend=object())


def test_permissions_deny_paths() -> None:
    model = ScriptedModel([call("write_file", file_path="/secrets/key", content="k"), say("done")])
    result = create_deep_agent(
        model=model,
        permissions=[FilesystemPermission(operations=["write"], paths=["/secrets/**"], mode="deny")],
    ).invoke({"messages": "go"})
    assert result["messages"][2].status == "error"
    assert "/secrets/key" not in result["files"]


# --- subagents ---------------------------------------------------------------------------


def test_a_subagent_works_in_a_clean_context_and_hands_back_its_answer() -> None:
    seen: list[str] = []

    def lookup(topic: str) -> str:
        """Looks a topic up."""
        seen.append(topic)
        return f"facts about {topic}"

    model = ScriptedModel(
        [call("task", description="Research otters", subagent_type="researcher"), say("Otters are great.")],
        conversations=[{"when_task_contains": "Research otters", "turns": [call("lookup", topic="otters"), say("Otters hold hands.")]}],
    )
    agent = create_deep_agent(
        model=model,
        subagents=[{"name": "researcher", "description": "Researches topics.", "system_prompt": "Research.", "tools": [lookup]}],
    )
    result = agent.invoke({"messages": "tell me about otters"})
    assert seen == ["otters"]
    assert "Otters hold hands." in tool_results(result)[0]
    assert result["messages"][-1].content == "Otters are great."
    assert not any(m.content == "facts about otters" for m in result["messages"])


def test_an_unknown_subagent_type_lists_the_valid_ones() -> None:
    model = ScriptedModel([call("task", description="x", subagent_type="nobody"), say("ok")])
    agent = create_deep_agent(model=model, subagents=[{"name": "helper", "description": "Helps.", "system_prompt": "Help."}])
    out = tool_results(agent.invoke({"messages": "go"}))[0]
    assert "helper" in out and "general-purpose" in out


def test_a_fork_subagent_starts_from_the_parents_conversation(openai_mock: Any) -> None:
    # Needs the extension rebuilt with subagent modes (python/src/config.rs `mode`).
    def add(a: int, b: int) -> int:
        """Adds two numbers."""
        return a + b

    openai_mock.by_model = {
        "parent-model": [
            {"call": ("add", {"a": 2, "b": 3})},
            {"call": ("task", {"description": "Report the sum", "subagent_type": "twin"})},
            {"text": "The twin says 5."},
        ],
        "twin-model": [{"text": "The sum is 5."}],
        "loner-model": [{"text": "loner"}],
    }
    agent = create_deep_agent(
        model="openai_chat:parent-model",
        tools=[add],
        system_prompt="You are the PARENT.",
        subagents=[
            {"name": "twin", "description": "Continues.", "system_prompt": "You are the FORK.", "model": "openai_chat:twin-model", "mode": "fork"},
            {"name": "loner", "description": "Alone.", "system_prompt": "You are LONER.", "model": "openai_chat:loner-model"},
        ],
    )
    result = agent.invoke({"messages": [("user", "what is 2+3?")]})
    assert tool_results(result) == ["5", "The sum is 5."]
    assert result["messages"][-1].content == "The twin says 5."
    assert len(result["messages"]) == 6

    fork = [r for r in openai_mock.requests if r["model"] == "twin-model"]
    assert len(fork) == 1
    messages = fork[0]["messages"]
    system = json.dumps(messages[0])
    assert messages[0]["role"] in ("system", "developer")
    assert system.index("You are the PARENT.") < system.index("You are the FORK.")
    rest = messages[1:]
    assert [m["role"] for m in rest] == ["user", "assistant", "tool", "user"]
    assert "what is 2+3?" in json.dumps(rest[0])
    assert rest[1]["tool_calls"][0]["function"]["name"] == "add"
    assert "Report the sum" in json.dumps(rest[3])
    assert "task" not in json.dumps(rest[:3]), "the turn that called task is left out"


def test_an_unknown_subagent_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="invalid subagent mode `forked`"):
        create_deep_agent(
            model=ScriptedModel([say("x")]),
            subagents=[{"name": "x", "description": "d", "system_prompt": "p", "mode": "forked"}],
        )


def test_a_subagent_without_a_description_is_refused() -> None:
    with pytest.raises(ValueError, match="description"):
        create_deep_agent(model=ScriptedModel([say("x")]), subagents=[{"name": "x", "system_prompt": "p"}])


# --- approvals and threads ---------------------------------------------------------------


def test_an_interrupted_run_returns_its_pending_actions_and_resumes_with_command() -> None:
    written: list[str] = []

    def send_email(to: str, body: str) -> str:
        """Sends an email."""
        written.append(to)
        return "sent"

    model = ScriptedModel([call("send_email", to="a@b.c", body="hi"), say("Email sent.")])
    agent = create_deep_agent(model=model, tools=[send_email], interrupt_on={"send_email": True}, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "hitl-1"}}
    paused = agent.invoke({"messages": "email them"}, config)
    assert written == []
    interrupt = paused["__interrupt__"][0]
    request = interrupt.value["action_requests"][0]
    assert request["name"] == "send_email" and request["args"] == {"to": "a@b.c", "body": "hi"}
    assert "approve" in interrupt.value["review_configs"][0]["allowed_decisions"]
    state = agent.get_state(config)
    assert state.next == ("tools",) and state.interrupts
    done = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
    assert written == ["a@b.c"]
    assert done["messages"][-1].content == "Email sent."
    assert "__interrupt__" not in done


def test_a_rejected_or_edited_action_changes_what_runs() -> None:
    sent: list[str] = []

    def send(to: str) -> str:
        """Sends."""
        sent.append(to)
        return "ok"

    model = ScriptedModel([call("send", to="wrong@x"), say("done")])
    agent = create_deep_agent(model=model, tools=[send], interrupt_on={"send": {"allowed_decisions": ["approve", "edit", "reject"]}}, checkpointer=InMemorySaver())
    edit = {"configurable": {"thread_id": "edit"}}
    agent.invoke({"messages": "send"}, edit)
    agent.invoke(Command(resume={"decisions": [{"type": "edit", "edited_action": {"name": "send", "args": {"to": "right@x"}}}]}), edit)
    assert sent == ["right@x"]
    reject = {"configurable": {"thread_id": "reject"}}
    agent.invoke({"messages": "send"}, reject)
    result = agent.invoke(Command(resume={"decisions": [{"type": "reject", "message": "not now"}]}), reject)
    assert sent == ["right@x"]
    assert "not now" in tool_results(result)[0]
    with pytest.raises(InvalidRequest, match="no decision"):
        agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), reject)


def test_a_bad_resume_and_a_resume_without_checkpointer_are_clear_errors() -> None:
    model = ScriptedModel([call("write_file", file_path="/x", content="y"), say("done")])
    agent = create_deep_agent(model=model, interrupt_on={"write_file": True}, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "bad-resume"}}
    agent.invoke({"messages": "go"}, config)
    with pytest.raises(InvalidRequest, match="1 pending"):
        agent.invoke(Command(resume={"decisions": []}), config)
    # Nothing was lost: the pause still waits and a good resume finishes it.
    assert agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)["files"]["/x"]["content"] == "y"
    stateless = create_deep_agent(model=model, interrupt_on={"write_file": True})
    assert stateless.invoke({"messages": "go"})["__interrupt__"]
    with pytest.raises(ValueError, match="checkpointer"):
        stateless.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)


def test_a_resume_for_an_interrupt_no_longer_pending_is_refused_and_changes_nothing() -> None:
    model = ScriptedModel([call("write_file", file_path="/one.md", content="1"), call("write_file", file_path="/two.md", content="2"), say("done")])
    agent = create_deep_agent(model=model, interrupt_on={"write_file": True}, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "stale-resume"}}
    approve = {"decisions": [{"type": "approve"}]}
    first = agent.invoke({"messages": "write both"}, config)["__interrupt__"][0]
    after_first = agent.invoke(Command(resume={first.id: approve}), config)
    assert after_first["files"]["/one.md"]["content"] == "1"
    second = after_first["__interrupt__"][0]
    assert second.value["action_requests"][0]["args"]["file_path"] == "/two.md"
    assert second.id and second.id != first.id
    # The first approval sent again (a retry, a screen showing the old pause), an unknown id,
    # a tool call's id: refused with the pending interrupt named, and nothing runs.
    for stale in (first.id, "interrupt-unknown", "call_1_0"):
        with pytest.raises(InvalidRequest, match=re.escape(second.id)) as refused:
            agent.invoke(Command(resume={stale: approve}), config)
        assert "re-read the thread state" in str(refused.value)
    state = agent.get_state(config)
    assert "/two.md" not in state.values["files"]
    assert [i.id for i in state.interrupts] == [second.id]
    # The pending interrupt's id, with the wrong count: still the count's error.
    with pytest.raises(InvalidRequest, match="0 decisions for 1"):
        agent.invoke(Command(resume={second.id: {"decisions": []}}), config)
    done = agent.invoke(Command(resume={second.id: approve}), config)
    assert done["files"]["/two.md"]["content"] == "2"
    assert "__interrupt__" not in done
    # Once nothing is pending, even the last good id is stale.
    with pytest.raises(InvalidRequest, match="no interrupt is pending"):
        agent.invoke(Command(resume={second.id: approve}), config)


def test_threads_remember_and_sqlite_threads_survive_a_new_agent(tmp_path: Path) -> None:
    model = ScriptedModel([say("first answer"), say("second answer")])
    db = tmp_path / "threads.db"
    config = {"configurable": {"thread_id": "long-1"}}
    agent = create_deep_agent(model=model, checkpointer=SqliteSaver(db))
    agent.invoke({"messages": "one"}, config)
    del agent
    again = create_deep_agent(model=model, checkpointer=SqliteSaver(db))
    result = again.invoke({"messages": "two"}, config)
    assert [m.content for m in result["messages"]] == ["one", "first answer", "two", "second answer"]
    other = again.invoke({"messages": "fresh"}, {"configurable": {"thread_id": "long-2"}})
    assert [m.content for m in other["messages"]] == ["fresh", "first answer"]


def test_without_a_checkpointer_every_call_starts_fresh_and_history_can_be_passed() -> None:
    model = ScriptedModel([say("a1"), say("a2")])
    agent = create_deep_agent(model=model)
    assert len(agent.invoke({"messages": "q1"}, {"configurable": {"thread_id": "ignored"}})["messages"]) == 2
    history = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    result = agent.invoke({"messages": history})
    assert [m.content for m in result["messages"]] == ["q1", "a1", "q2", "a2"]


# --- streaming, async, structured output, caps --------------------------------------------


def test_stream_modes_yield_updates_values_and_message_chunks() -> None:
    model = ScriptedModel([call("write_todos", todos=[{"content": "plan", "status": "in_progress"}]), say("planned")])
    agent = create_deep_agent(model=model, todos=True)
    updates = list(agent.stream({"messages": "plan"}, stream_mode="updates"))
    assert [list(u) for u in updates] == [["model"], ["tools"], ["model"]]
    assert updates[1]["tools"]["todos"][0]["content"] == "plan"
    assert updates[2]["model"]["messages"][-1].content == "planned"
    values = list(agent.stream({"messages": "plan"}, stream_mode="values"))
    assert values[-1]["messages"][-1].content == "planned"
    assert len(values[-1]["messages"]) > len(values[0]["messages"])
    pairs = list(agent.stream({"messages": "plan"}, stream_mode=["updates", "messages"]))
    assert {mode for mode, _ in pairs} == {"updates", "messages"}
    chunk, meta = next(p for m, p in pairs if m == "messages")
    assert meta["langgraph_node"] in ("model", "tools")
    assert "planned" in "".join(c.content for m, (c, _) in [(m, p) for m, p in pairs if m == "messages"] if isinstance(c.content, str))


def test_subgraph_streaming_namespaces_subagent_chunks() -> None:
    model = ScriptedModel(
        [call("task", description="Sub job", subagent_type="general-purpose"), say("top done")],
        conversations=[{"when_task_contains": "Sub job", "turns": [say("sub done")]}],
    )
    items = list(create_deep_agent(model=model).stream({"messages": "go"}, stream_mode="messages", subgraphs=True))
    namespaces = {ns for ns, _ in items}
    assert () in namespaces
    assert any(ns and ns[0].startswith("tools:") for ns in namespaces)


def test_ainvoke_and_astream_do_not_block_the_loop_and_async_tools_use_it() -> None:
    async def ping(n: int) -> str:
        """Pings."""
        await asyncio.sleep(0.01)
        return f"pong {n} on {id(asyncio.get_running_loop())}"

    model = ScriptedModel([call("ping", n=1), say("pinged")])
    agent = create_deep_agent(model=model, tools=[ping])

    async def main() -> tuple[dict[str, Any], list[Any], int, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        result = await agent.ainvoke({"messages": "ping"})
        chunks = [c async for c in agent.astream({"messages": "ping"}, stream_mode="updates")]
        task.cancel()
        return result, chunks, ticks, id(asyncio.get_running_loop())

    result, chunks, ticks, loop_id = asyncio.run(main())
    assert tool_results(result) == [f"pong 1 on {loop_id}"]
    assert [list(c) for c in chunks] == [["model"], ["tools"], ["model"]]
    assert ticks > 0


class Answer(BaseModel):
    city: str
    temperature: int


def test_structured_response_comes_back_as_the_model_class() -> None:
    # The structured answer is given through the `final_answer` tool (the reference names
    # the tool after the schema).
    model = ScriptedModel([call("final_answer", city="Oslo", temperature=3)])
    result = create_deep_agent(model=model, response_format=Answer).invoke({"messages": "weather?"})
    assert result["structured_response"] == Answer(city="Oslo", temperature=3)


def test_a_token_cap_stops_the_run_with_its_state() -> None:
    def noop() -> str:
        """Does nothing."""
        return "ok"

    turns = [{**call("noop"), "usage": {"input_tokens": 600, "output_tokens": 10}} for _ in range(5)] + [say("never")]
    agent = create_deep_agent(model=ScriptedModel(turns), tools=[noop], max_tokens=1000)
    with pytest.raises(SpendCapExceeded) as raised:
        agent.invoke({"messages": "loop"})
    assert raised.value.values["messages"][0].content == "loop"


def test_a_cost_cap_on_a_model_without_prices_is_refused_with_the_fix() -> None:
    # It could never stop a run: said when the agent is made, not found out after the bill.
    with pytest.raises(ValueError, match=r"max_cost_usd needs the model's prices.*max_tokens"):
        create_deep_agent(model=ScriptedModel([say("x")]), max_cost_usd=1.0)


def test_bad_input_and_bad_configuration_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="model"):
        create_deep_agent(model="nosuchprovider:x")
    with pytest.raises(TypeError, match="ScriptedModel"):
        create_deep_agent(model=42)
    with pytest.raises(TypeError, match="functions"):
        create_deep_agent(model=ScriptedModel([say("x")]), tools=[42])
    agent = create_deep_agent(model=ScriptedModel([say("x")]))
    with pytest.raises(TypeError, match="invoke"):
        agent.invoke(42)
    with pytest.raises(ValueError, match="stream_mode"):
        list(agent.stream({"messages": "x"}, stream_mode="nope"))
    with pytest.raises(InvalidRequest, match="message"):
        agent.invoke({"messages": [{"role": "wizard", "content": "x"}]})


def test_a_provider_spec_runs_against_a_local_openai_compatible_server(openai_mock: Any) -> None:
    def add(a: int, b: int) -> int:
        """Adds two numbers."""
        return a + b

    openai_mock.turns = [{"call": ("add", {"a": 2, "b": 3})}, {"text": "2 + 3 = 5"}]
    agent = create_deep_agent(model="openai_chat:mock-model", tools=[add], system_prompt="Use tools.")
    result = agent.invoke({"messages": [("user", "what is 2+3?")]})
    assert tool_results(result) == ["5"]
    assert result["messages"][-1].content == "2 + 3 = 5"
    first = openai_mock.requests[0]
    assert first["model"] == "mock-model"
    assert any(t["function"]["name"] == "add" for t in first["tools"])
    assert first["messages"][0]["role"] in ("system", "developer")
    assert "Use tools." in json.dumps(first["messages"][0])


def test_batch_runs_every_input_and_recursion_limit_bounds_a_run() -> None:
    agent = create_deep_agent(model=ScriptedModel([say("same")]))
    results = agent.batch([{"messages": "a"}, {"messages": "b"}, {"messages": "c"}])
    assert [r["messages"][0].content for r in results] == ["a", "b", "c"]
    assert [r["messages"][-1].content for r in asyncio.run(agent.abatch([{"messages": "x"}, {"messages": "y"}]))] == ["same", "same"]

    def noop() -> str:
        """Does nothing."""
        return "ok"

    looping = create_deep_agent(model=ScriptedModel([call("noop")] * 10 + [say("end")]), tools=[noop])
    with pytest.raises(AgentError) as raised:
        looping.invoke({"messages": "go"}, {"recursion_limit": 6})
    assert raised.value.kind == "turn_limit"
    assert len([m for m in raised.value.values["messages"] if m.type == "ai"]) == 3
    assert looping.invoke({"messages": "go"})["messages"][-1].content == "end"


def test_input_can_seed_files_and_todos_and_langgraph_style_commands_work() -> None:
    model = ScriptedModel([call("read_file", file_path="/seed.md"), say("read it")])
    result = create_deep_agent(model=model).invoke(
        {"messages": "read the seed", "files": {"/seed.md": "planted text", "/other.md": {"content": "x"}}, "todos": [{"content": "read", "status": "pending"}]}
    )
    assert "planted text" in tool_results(result)[0]
    assert result["files"]["/other.md"]["content"] == "x"
    assert result["todos"][0]["content"] == "read"

    @dataclasses.dataclass
    class ForeignCommand:  # as langgraph.types.Command looks to us
        resume: Any = None
        update: Any = None
        goto: Any = ()

    ForeignCommand.__name__ = "Command"
    agent = create_deep_agent(model=ScriptedModel([call("write_file", file_path="/a", content="b"), say("ok")]), interrupt_on={"write_file": True}, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "foreign"}}
    agent.invoke({"messages": "go"}, config)
    assert agent.invoke(ForeignCommand(resume={"decisions": [{"type": "approve"}]}), config)["files"]["/a"]["content"] == "b"


def test_subagents_may_name_the_parents_tools() -> None:
    used: list[str] = []

    def lookup(topic: str) -> str:
        """Looks up."""
        used.append(topic)
        return "found"

    model = ScriptedModel(
        [call("task", description="Find cats", subagent_type="finder"), say("done")],
        conversations=[{"when_task_contains": "Find cats", "turns": [call("lookup", topic="cats"), say("cats found")]}],
    )
    agent = create_deep_agent(model=model, tools=[lookup], subagents=[{"name": "finder", "description": "Finds.", "system_prompt": "Find.", "tools": ["lookup", "read_file"]}])
    assert "cats found" in tool_results(agent.invoke({"messages": "go"}))[0]
    assert used == ["cats"]
    with pytest.raises(ValueError, match="nosuch"):
        create_deep_agent(model=model, tools=[lookup], subagents=[{"name": "f", "description": "d", "tools": ["nosuch"]}])


class ShellDictBackend(DictBackend):
    """A Python sandbox in the reference's shape: the file protocol plus `execute`."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[str] = []

    def execute(self, command: str) -> dict[str, Any]:
        self.commands.append(command)
        return {"output": f"ran {command}", "exit_code": 3, "truncated": False}


def test_a_python_backend_with_execute_gets_the_execute_tool() -> None:
    backend = ShellDictBackend()
    model = ScriptedModel([call("execute", command="make test"), say("ran")])
    agent = create_deep_agent(model=model, backend=backend)
    assert "execute" in [t["name"] for t in agent.tools]
    assert "execute" not in [t["name"] for t in create_deep_agent(model=model, backend=DictBackend()).tools]
    result = agent.invoke({"messages": "test it"})
    assert backend.commands == ["make test"]
    out = tool_results(result)[0]
    assert "ran make test" in out and "3" in out


def test_the_readme_quickstart_runs() -> None:
    import subprocess
    import sys

    script = Path(__file__).parent.parent / "examples" / "quickstart.py"
    readme = (Path(__file__).parent.parent.parent / "README.md").read_text()
    body = script.read_text().split('"""', 2)[2].strip()
    assert body.replace("\n\n\n", "\n\n") in readme, "README's Python example and examples/quickstart.py differ"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Sunny in Paris."


@pytest.mark.parametrize(
    ("spec", "base_var", "key_var", "path"),
    [
        ("anthropic:claude-sonnet-4-5", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", ""),
        ("openai:gpt-4o", "OPENAI_BASE_URL", "OPENAI_API_KEY", "/v1"),
        ("openai_chat:gpt-4o", "OPENAI_BASE_URL", "OPENAI_API_KEY", "/v1"),
        ("google_genai:gemini-2.5-flash", "GEMINI_BASE_URL", "GEMINI_API_KEY", ""),
    ],
)
def test_every_provider_api_runs_a_python_tool_loop_against_aimock(
    aimock: Any, monkeypatch: pytest.MonkeyPatch, spec: str, base_var: str, key_var: str, path: str
) -> None:
    server = aimock(
        [
            {
                "match": {"userMessage": "weather", "hasToolResult": False},
                "response": {
                    "toolCalls": [
                        {"id": "call_w1", "name": "get_weather", "arguments": '{"city":"Paris"}'}
                    ]
                },
            },
            {
                "match": {"userMessage": "weather", "hasToolResult": True},
                "response": {"content": "It is sunny in Paris, 21 degrees."},
            },
        ]
    )
    # The more specific Gemini variable would win over GEMINI_BASE_URL.
    monkeypatch.delenv("GOOGLE_GEMINI_BASE_URL", raising=False)
    monkeypatch.setenv(base_var, server.url + path)
    monkeypatch.setenv(key_var, "test-key")
    seen: list[str] = []

    def get_weather(city: str) -> str:
        """Get the weather for a city."""
        seen.append(city)
        return f"Sunny, 21 degrees in {city}"

    agent = create_deep_agent(model=spec, tools=[get_weather])
    result = agent.invoke({"messages": [{"role": "user", "content": "What is the weather in Paris?"}]})
    assert seen == ["Paris"]
    assert tool_results(result) == ["Sunny, 21 degrees in Paris"]
    assert result["messages"][-1].content == "It is sunny in Paris, 21 degrees."
    calls = [entry for entry in server.journal() if "__aimock" not in entry["path"]]
    assert len(calls) == 2
    assert "get_weather" in json.dumps(calls[0]["body"])
    assert "Sunny, 21 degrees in Paris" in json.dumps(calls[1]["body"])

    tokens = [
        chunk.content
        for chunk, _ in agent.stream(
            {"messages": "What is the weather in Paris?"}, stream_mode="messages"
        )
        if chunk.type == "AIMessageChunk" and isinstance(chunk.content, str)
    ]
    assert "".join(tokens) == "It is sunny in Paris, 21 degrees."
