"""Model objects instead of strings: init_chat_model for the agent, ChatOpenAI for a subagent."""

import os

from deepagents import create_deep_agent
from langchain.chat_models import init_chat_model
from langchain_openai import ChatOpenAI

MOCK_SCRIPT = [
    # Each model has turns of its own: a request to the wrong model finds no rule and fails.
    {"when": {"model": "gpt-4.1-mini", "first_user_contains": "TRANSLATE"}, "turns": [
        {"text": "Bonjour le monde"},
    ]},
    {"when": {"model": "gpt-4o-mini", "tool_offered": "task"}, "turns": [
        {"calls": [["task", {"description": "TRANSLATE to French: Hello world", "subagent_type": "translator"}]]},
        {"text": "In French: Bonjour le monde"},
    ]},
]

main_model = init_chat_model("openai:gpt-4o-mini", temperature=0)
translator_model = ChatOpenAI(model="gpt-4.1-mini", base_url=os.environ["OPENAI_BASE_URL"], temperature=0)

agent = create_deep_agent(
    model=main_model,
    subagents=[{
        "name": "translator",
        "description": "Translates short texts into French.",
        "system_prompt": "Translate the text you are given into French. Reply with the translation only.",
        "model": translator_model,
    }],
)
result = agent.invoke({"messages": [{"role": "user", "content": "Say 'Hello world' in French."}]})

task = next(m for m in result["messages"] if m.type == "tool" and m.name == "task")
assert "Bonjour le monde" in task.content, task.content
assert result["messages"][-1].content == "In French: Bonjour le monde"
print("OK p10: the agent and its subagent used their own model objects")
