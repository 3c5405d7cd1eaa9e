"""A LangChain tool made with @tool, with a typed signature and a docstring."""

from deepagents import create_deep_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

MOCK_SCRIPT = [
    {"when": {"tool_offered": "convert_currency"}, "turns": [
        {"calls": [["convert_currency", {"amount": 100.0, "currency": "JPY"}]]},
        {"text": "100 EUR is 16000 JPY."},
    ]},
]


@tool
def convert_currency(amount: float, currency: str) -> str:
    """Convert an amount in euros to another currency.

    Args:
        amount: The amount in euros.
        currency: The ISO code of the target currency.
    """
    rate = {"JPY": 160.0, "USD": 1.1}[currency]
    return f"{amount:g} EUR = {amount * rate:g} {currency}"


assert convert_currency.name == "convert_currency"
agent = create_deep_agent(model=ChatOpenAI(model="gpt-4o-mini"), tools=[convert_currency])
result = agent.invoke({"messages": [{"role": "user", "content": "Convert 100 euros to yen."}]})

call = next(m for m in result["messages"] if m.type == "ai" and m.tool_calls).tool_calls[0]
assert call["name"] == "convert_currency" and call["args"] == {"amount": 100.0, "currency": "JPY"}, call
tool_message = next(m for m in result["messages"] if m.type == "tool")
assert tool_message.content == "100 EUR = 16000 JPY", tool_message.content
assert tool_message.tool_call_id == call["id"]
assert result["messages"][-1].content == "100 EUR is 16000 JPY."
print("OK p08: the @tool tool was offered, called and answered")
