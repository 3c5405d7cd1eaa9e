"""A custom subagent, described by a dict, that the main agent delegates to with `task`."""

from deepagents import create_deep_agent
from langchain_openai import ChatOpenAI

MOCK_SCRIPT = [
    # The researcher's own conversation: its task description is its first user message.
    {"when": {"first_user_contains": "LOOKUP"}, "turns": [
        {"calls": [["search_library", {"query": "Dune"}]]},
        {"text": "Dune was written by Frank Herbert (1965)."},
    ]},
    {"turns": [
        {"calls": [["task", {"description": "LOOKUP: who wrote the novel Dune?", "subagent_type": "researcher"}]]},
        {"text": "The researcher says Frank Herbert wrote Dune."},
    ]},
]

searches: list[str] = []


def search_library(query: str) -> str:
    """Search the library catalogue for a book."""
    searches.append(query)
    return "Dune, by Frank Herbert, Chilton Books, 1965"


researcher = {
    "name": "researcher",
    "description": "Looks books up in the library catalogue and reports the facts.",
    "system_prompt": "You are a careful librarian. Use search_library, then answer in one sentence.",
    "tools": [search_library],
}

agent = create_deep_agent(
    model=ChatOpenAI(model="gpt-4o-mini"),
    subagents=[researcher],
    system_prompt="Delegate book questions to the researcher subagent.",
)
result = agent.invoke({"messages": [{"role": "user", "content": "Who wrote Dune? Ask the researcher."}]})

assert searches == ["Dune"], searches
task_results = [m for m in result["messages"] if m.type == "tool" and m.name == "task"]
assert len(task_results) == 1, result["messages"]
assert "Frank Herbert (1965)" in task_results[0].content, task_results[0].content
assert "Frank Herbert wrote Dune" in result["messages"][-1].content
# The subagent's own tool calls stay in its conversation, not the main one.
assert not any(m.type == "tool" and m.name == "search_library" for m in result["messages"])
print("OK p02: the main agent delegated to the researcher subagent via task")
