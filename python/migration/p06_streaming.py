"""Streaming a run: node updates (stream_mode="updates") and model tokens ("messages")."""

from deepagents import create_deep_agent
from langchain_openai import ChatOpenAI

MOCK_SCRIPT = [
    {"turns": [
        {"calls": [["lookup_price", {"item": "coffee"}]]},
        {"text": "A coffee costs 3 euros here."},
    ]},
]


def lookup_price(item: str) -> str:
    """Look up the price of a menu item."""
    return f"{item}: 3 EUR"


def make_agent():
    return create_deep_agent(model=ChatOpenAI(model="gpt-4o-mini"), tools=[lookup_price])


question = {"messages": [{"role": "user", "content": "How much is a coffee?"}]}

# "updates": one dict per step, keyed by the node that ran.
updates = list(make_agent().stream(question, stream_mode="updates"))
assert updates and all(isinstance(u, dict) for u in updates), updates
nodes = [node for u in updates for node in u]
assert "model" in nodes and "tools" in nodes, nodes
messages = [m for u in updates for node in u.values() if isinstance(node, dict) for m in node.get("messages", [])]
ai_calls = [m for m in messages if m.type == "ai" and m.tool_calls]
assert ai_calls and ai_calls[0].tool_calls[0]["name"] == "lookup_price", messages
tools = [m for m in messages if m.type == "tool"]
assert tools and "coffee: 3 EUR" in tools[0].content, messages
assert messages[-1].type == "ai" and messages[-1].content == "A coffee costs 3 euros here.", messages[-1]

# "messages": (chunk, metadata) pairs as the model produces tokens.
pieces = []
streamed_from = set()
for chunk, metadata in make_agent().stream(question, stream_mode="messages"):
    assert isinstance(metadata, dict), metadata
    streamed_from.add((chunk.type, metadata.get("langgraph_node")))
    if chunk.type in ("AIMessageChunk", "ai") and isinstance(chunk.content, str):
        pieces.append(chunk.content)
assert ("AIMessageChunk", "model") in streamed_from, streamed_from
assert ("tool", "tools") in streamed_from, streamed_from
text = "".join(pieces)
assert "A coffee costs 3 euros here." in text, pieces
assert len([p for p in pieces if p]) > 1, "expected the answer in several chunks"
print("OK p06: updates and message chunks streamed")
