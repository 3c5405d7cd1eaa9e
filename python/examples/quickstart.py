"""The README's ten-line script: a Python tool, the offline scripted model."""

from deepagents_rs import ScriptedModel, create_deep_agent


def get_weather(city: str) -> str:
    """Get the weather for a city."""
    return f"Sunny in {city}"


model = ScriptedModel([{"tool_calls": [{"name": "get_weather", "args": {"city": "Paris"}}]},
                       {"text": "Sunny in Paris."}])   # or "anthropic:claude-sonnet-4-5", ChatOpenAI(…), …
agent = create_deep_agent(model=model, tools=[get_weather], system_prompt="Be brief.")
result = agent.invoke({"messages": [{"role": "user", "content": "Weather in Paris?"}]})
print(result["messages"][-1].content)
