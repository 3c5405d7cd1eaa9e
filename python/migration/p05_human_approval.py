"""Human-in-the-loop: a tool call pauses for approval and the run resumes once approved."""

from deepagents import create_deep_agent
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

MOCK_SCRIPT = [
    {"turns": [
        {"calls": [["delete_records", {"table": "sessions", "older_than_days": 30}]]},
        {"text": "Deleted the old sessions."},
    ]},
]

deleted: list[tuple[str, int]] = []


def delete_records(table: str, older_than_days: int) -> str:
    """Delete rows older than the given number of days from a table."""
    deleted.append((table, older_than_days))
    return f"deleted 42 rows from {table}"


agent = create_deep_agent(
    model=ChatOpenAI(model="gpt-4o-mini"),
    tools=[delete_records],
    interrupt_on={"delete_records": True},
    checkpointer=InMemorySaver(),
)
config = {"configurable": {"thread_id": "cleanup-1"}}

paused = agent.invoke({"messages": [{"role": "user", "content": "Clean up sessions older than 30 days."}]}, config)
assert "__interrupt__" in paused, list(paused)
assert deleted == [], "the tool ran before it was approved"
request = paused["__interrupt__"][0].value
action = request["action_requests"][0]
assert action["name"] == "delete_records", action
assert action["args"] == {"table": "sessions", "older_than_days": 30}, action
assert "approve" in request["review_configs"][0]["allowed_decisions"], request

done = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
assert deleted == [("sessions", 30)], deleted
assert "__interrupt__" not in done
tool_messages = [m for m in done["messages"] if m.type == "tool"]
assert tool_messages and "deleted 42 rows" in tool_messages[-1].content, tool_messages
assert done["messages"][-1].content == "Deleted the old sessions."
print("OK p05: the call waited for approval and ran once approved")
