"""The reference deep agent for the server benchmark: LangChain's deepagents on the same mock
model our server is pointed at (MOCK_MODEL_URL), served by `langgraph dev`."""

import os

from deepagents import create_deep_agent
from langchain_openai import ChatOpenAI

model = ChatOpenAI(model="mock", base_url=os.environ["MOCK_MODEL_URL"], api_key="bench",
                   streaming=True, max_retries=0, timeout=600)
graph = create_deep_agent(model=model)
