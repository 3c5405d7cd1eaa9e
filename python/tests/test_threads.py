"""Threads across processes and crashes, state history and updates, PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from deepagents_rs import InMemorySaver, PostgresSaver, ScriptedModel, SqliteSaver, create_deep_agent

CHILD = '''
import sys, time, pathlib
from deepagents_rs import create_deep_agent, mutating, ScriptedModel, SqliteSaver

db, marker, log, mode = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3]), sys.argv[4]
marked = sys.argv[5:] == ["mutating"]

def slow(n: int) -> str:
    """Works on step n."""
    with log.open("a") as f:
        f.write(f"{n}\\n")
    if n == 1 and not marker.exists():
        marker.write_text("started")
        time.sleep(120)
    return f"ok {n}"

if marked:
    slow = mutating(slow)

model = ScriptedModel([
    {"tool_calls": [{"name": "slow", "args": {"n": 0}}]},
    {"tool_calls": [{"name": "slow", "args": {"n": 1}}]},
    {"text": "finished"},
])
agent = create_deep_agent(model=model, tools=[slow], checkpointer=SqliteSaver(db))
config = {"configurable": {"thread_id": "crash-1"}}
result = agent.invoke({"messages": "work"} if mode == "start" else None, config)
print(result["messages"][-1].content)
print(result["messages"][-2].content)
'''


def _kill_mid_tool_and_resume(tmp_path: Path, *flags: str) -> tuple[list[str], list[str]]:
    """Kills a child process while its tool's second call runs, resumes the thread in a new
    one; what the tool logged and the resumed run's last two messages."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    db, marker, log = tmp_path / "threads.db", tmp_path / "marker", tmp_path / "calls.log"
    child = subprocess.Popen([sys.executable, str(script), str(db), str(marker), str(log), "start", *flags])
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert child.poll() is None, "the child ended before its slow step"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    resumed = subprocess.run(
        [sys.executable, str(script), str(db), str(marker), str(log), "resume", *flags],
        capture_output=True, text=True, timeout=60,
    )
    assert resumed.returncode == 0, resumed.stderr
    return log.read_text().split(), resumed.stdout.strip().splitlines()


def test_a_run_killed_mid_tool_resumes_in_a_new_process_without_redoing_finished_steps(tmp_path: Path) -> None:
    calls, (answer, result) = _kill_mid_tool_and_resume(tmp_path)
    assert answer == "finished"
    # Step 0 ran once; step 1 was in flight when the process died and ran again (a tool is
    # read-only unless marked).
    assert calls == ["0", "1", "1"]
    assert result == "ok 1"


def test_a_mutating_tool_in_flight_at_a_crash_is_not_run_again(tmp_path: Path) -> None:
    calls, (answer, result) = _kill_mid_tool_and_resume(tmp_path, "mutating")
    assert answer == "finished"
    assert calls == ["0", "1"], "the marked tool ran again"
    assert "Interrupted" in result, result


def test_state_history_and_update_state() -> None:
    model = ScriptedModel([{"text": "one"}, {"text": "two"}])
    agent = create_deep_agent(model=model, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "hist"}}
    agent.invoke({"messages": "a"}, config)
    agent.invoke({"messages": "b"}, config)
    history = list(agent.get_state_history(config))
    assert [m.content for m in history[0].values["messages"]] == ["a", "one", "b", "two"]
    assert len(history[-1].values["messages"]) < len(history[0].values["messages"])
    old = agent.get_state(history[-1].config)
    assert old.values["messages"] == history[-1].values["messages"]
    assert len(list(agent.get_state_history(config, limit=1))) == 1
    agent.update_state(config, {"files": {"/plan.md": {"content": "step 1"}}, "todos": [{"content": "x", "status": "pending"}]})
    state = agent.get_state(config)
    assert state.values["files"]["/plan.md"]["content"] == "step 1"
    assert state.values["todos"][0]["content"] == "x"
    first_id = state.values["messages"][1].id
    agent.update_state(config, {"messages": [{"role": "assistant", "content": "ONE", "id": first_id}]})
    assert agent.get_state(config).values["messages"][1].content == "ONE"


def test_two_agents_on_one_saver_object_share_threads() -> None:
    saver = InMemorySaver()
    config = {"configurable": {"thread_id": "shared"}}
    create_deep_agent(model=ScriptedModel([{"text": "hi"}]), checkpointer=saver).invoke({"messages": "x"}, config)
    other = create_deep_agent(model=ScriptedModel([{"text": "hi"}]), checkpointer=saver)
    assert [m.content for m in other.get_state(config).values["messages"]] == ["x", "hi"]


def test_langgraphs_in_memory_saver_holds_the_threads_of_every_agent_given_it() -> None:
    memory = pytest.importorskip("langgraph.checkpoint.memory")
    saver = memory.InMemorySaver()
    config = {"configurable": {"thread_id": "lg-shared"}}
    create_deep_agent(model=ScriptedModel([{"text": "hi"}]), checkpointer=saver).invoke({"messages": "x"}, config)
    same = create_deep_agent(model=ScriptedModel([{"text": "hi"}]), checkpointer=saver)
    assert [m.content for m in same.get_state(config).values["messages"]] == ["x", "hi"]
    # The threads are in the saver itself.
    assert [m.content for m in saver.get_tuple(config).checkpoint["channel_values"]["messages"]] == ["x", "hi"]
    other = create_deep_agent(model=ScriptedModel([{"text": "hi"}]), checkpointer=memory.InMemorySaver())
    assert other.get_state(config).values.get("messages", []) == []


def test_postgres_threads_survive_a_new_agent() -> None:
    url = os.environ.get("DEEPAGENTS_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("CI") == "true":
            pytest.fail("DEEPAGENTS_TEST_POSTGRES_URL is not set (scripts/test starts PostgreSQL)")
        pytest.skip("no PostgreSQL (set DEEPAGENTS_TEST_POSTGRES_URL)")
    config = {"configurable": {"thread_id": f"py-{uuid.uuid4().hex[:12]}"}}
    model = ScriptedModel([{"text": "first"}, {"text": "second"}])
    create_deep_agent(model=model, checkpointer=PostgresSaver(url)).invoke({"messages": "one"}, config)
    result = create_deep_agent(model=model, checkpointer=PostgresSaver(url)).invoke({"messages": "two"}, config)
    assert [m.content for m in result["messages"]] == ["one", "first", "two", "second"]


INTERRUPTED = '''
import pathlib, signal, sys, time
from deepagents_rs import create_deep_agent, ScriptedModel

signal.signal(signal.SIGINT, signal.default_int_handler)  # a background parent may ignore it
marker = pathlib.Path(sys.argv[1])

def slow() -> str:
    """Takes long."""
    marker.write_text("started")
    time.sleep(60)
    return "done"

agent = create_deep_agent(model=ScriptedModel([{"tool_calls": [{"name": "slow"}]}, {"text": "end"}]), tools=[slow])
try:
    agent.invoke({"messages": "go"})
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
'''


def test_ctrl_c_interrupts_a_running_invoke_at_once(tmp_path: Path) -> None:
    script, marker = tmp_path / "child.py", tmp_path / "marker"
    script.write_text(INTERRUPTED)
    child = subprocess.Popen([sys.executable, str(script), str(marker)], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    started = time.monotonic()
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 130
    assert out.strip() == "interrupted"
    assert time.monotonic() - started < 10


def test_a_langgraph_store_is_the_agents_store_both_ways() -> None:
    memory = pytest.importorskip("langgraph.store.memory")
    from deepagents_rs.backends import CompositeBackend, StateBackend, StoreBackend
    from deepagents_rs.backends.utils import create_file_data, file_data_to_string

    store = memory.InMemoryStore()
    # What LangGraph code put in the store, the agent reads.
    store.put(("filesystem",), "/seed.md", create_file_data("seeded by the user"))
    model = ScriptedModel([
        {"tool_calls": [{"name": "read_file", "args": {"file_path": "/memories/seed.md"}}]},
        {"tool_calls": [{"name": "write_file", "args": {"file_path": "/memories/out.md", "content": "from the agent"}}]},
        {"text": "done"},
    ])

    def routes(rt: object) -> CompositeBackend:
        return CompositeBackend(default=StateBackend(rt), routes={"/memories/": StoreBackend(rt)})

    result = create_deep_agent(model=model, store=store, backend=routes).invoke({"messages": "go"})
    read = [m for m in result["messages"] if getattr(m, "type", None) == "tool"][0]
    assert "seeded by the user" in str(read.content), read.content
    # What the agent wrote, LangGraph code reads, in the reference's file format.
    written = store.get(("filesystem",), "/out.md")
    assert written is not None
    assert file_data_to_string(written.value) == "from the agent"
    assert written.value["encoding"] == "utf-8"
    keys = sorted(item.key for item in store.search(("filesystem",)))
    assert keys == ["/out.md", "/seed.md"]


def test_a_langgraph_sqlite_saver_keeps_the_threads_where_langgraph_code_reads_them(tmp_path: Path) -> None:
    import sqlite3

    sqlite_saver = pytest.importorskip("langgraph.checkpoint.sqlite")
    messages = pytest.importorskip("langchain_core.messages")
    path = tmp_path / "threads.db"
    config = {"configurable": {"thread_id": "lg-sqlite"}}
    model = ScriptedModel([
        {"tool_calls": [{"name": "write_file", "args": {"file_path": "/plan.md", "content": "step 1"}}]},
        {"text": "first"},
        {"text": "second"},
    ])
    saver = sqlite_saver.SqliteSaver(sqlite3.connect(path, check_same_thread=False))
    create_deep_agent(model=model, checkpointer=saver).invoke({"messages": "one"}, config)
    # LangGraph code reading the saver sees the thread as LangGraph's deepagents keeps it.
    latest = saver.get_tuple(config)
    channels = latest.checkpoint["channel_values"]
    assert [type(m).__name__ for m in channels["messages"]] == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    assert channels["messages"][-1].content == "first"
    assert channels["files"]["/plan.md"]["content"] == "step 1"
    # A new process (a new connection, a new agent) continues the thread.
    reopened = sqlite_saver.SqliteSaver(sqlite3.connect(path, check_same_thread=False))
    agent = create_deep_agent(model=model, checkpointer=reopened)
    result = agent.invoke({"messages": "two"}, config)
    assert [m.content for m in result["messages"]][-2:] == ["two", "second"]
    history = list(agent.get_state_history(config))
    assert len(history) == len(list(reopened.list(config))) and len(history) >= 4
    earlier = agent.get_state(history[-1].config)
    assert [m.content for m in earlier.values["messages"]] == ["one"]
    # A thread LangGraph's deepagents wrote (only its channels) continues here too.
    checkpoint_base = pytest.importorskip("langgraph.checkpoint.base")
    written = checkpoint_base.empty_checkpoint()
    written["channel_values"] = {"messages": [messages.HumanMessage("old question", id="h1"), messages.AIMessage("old answer", id="a1")], "todos": [{"content": "t", "status": "pending"}]}
    written["channel_versions"] = {"messages": reopened.get_next_version(None, None), "todos": reopened.get_next_version(None, None)}
    reference = {"configurable": {"thread_id": "written-by-the-reference", "checkpoint_ns": ""}}
    reopened.put(reference, written, {"source": "loop", "step": 1, "parents": {}}, dict(written["channel_versions"]))
    cont = create_deep_agent(model=ScriptedModel([{"text": "unused"}, {"text": "continued"}]), checkpointer=reopened)
    result = cont.invoke({"messages": "new question"}, reference)
    assert [m.content for m in result["messages"]] == ["old question", "old answer", "new question", "continued"]
    assert result["todos"][0]["content"] == "t"


def test_a_langgraph_saver_that_fails_fails_the_run_with_its_message() -> None:
    memory = pytest.importorskip("langgraph.checkpoint.memory")

    class Broken(memory.InMemorySaver):  # type: ignore[misc,name-defined]
        def put(self, *args: object, **kwargs: object) -> object:
            raise OSError("disk full")

    agent = create_deep_agent(model=ScriptedModel([{"text": "hi"}]), checkpointer=Broken())
    with pytest.raises(Exception, match="disk full"):
        agent.invoke({"messages": "x"}, {"configurable": {"thread_id": "broken"}})
