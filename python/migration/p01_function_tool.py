"""A deep agent with a plain Python function as its tool, the model named by a string."""

from deepagents import create_deep_agent

# The turns the scripted model plays (read by the migration runner's mock; unused here).
MOCK_SCRIPT = [
    {"turns": [
        {"calls": [["get_weather", {"city": "Lisbon"}]]},
        {"text": "It is sunny in Lisbon, 24 degrees."},
    ]},
]

calls: list[str] = []


def get_weather(city: str) -> str:
    """Return the current weather for a city."""
    calls.append(city)
    return f"Sunny and 24C in {city}"


agent = create_deep_agent(
    model="openai:gpt-4o-mini",
    tools=[get_weather],
    system_prompt="You are a concise weather assistant.",
)
result = agent.invoke({"messages": [{"role": "user", "content": "What is the weather in Lisbon?"}]})

assert calls == ["Lisbon"], calls
tool_messages = [m for m in result["messages"] if m.type == "tool"]
assert tool_messages and "Sunny and 24C in Lisbon" in tool_messages[0].content, tool_messages
assert tool_messages[0].name == "get_weather"
answer = result["messages"][-1]
assert answer.type == "ai" and "sunny in Lisbon" in answer.text, answer
print("OK p01: the function tool ran and the agent answered")
