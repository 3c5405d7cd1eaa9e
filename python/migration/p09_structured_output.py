"""Structured output: a Pydantic model as response_format, read from structured_response."""

from deepagents import create_deep_agent
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

MOCK_SCRIPT = [
    {"turns": [
        {"calls": [["read_thermometer", {"room": "lab"}]]},
        # Given as the JSON answer, or as a call of the schema's tool when it is offered as one.
        {"structured": {"room": "lab", "celsius": 21.5, "comfortable": True}},
    ]},
]


class RoomReport(BaseModel):
    """A report on one room's temperature."""

    room: str = Field(description="The room's name")
    celsius: float = Field(description="The temperature in degrees Celsius")
    comfortable: bool = Field(description="Whether the temperature is comfortable")


def read_thermometer(room: str) -> str:
    """Read the thermometer in a room."""
    return f"{room}: 21.5 C"


agent = create_deep_agent(model=ChatOpenAI(model="gpt-4o-mini"), tools=[read_thermometer], response_format=RoomReport)
result = agent.invoke({"messages": [{"role": "user", "content": "How warm is the lab?"}]})

report = result["structured_response"]
assert isinstance(report, RoomReport), type(report)
assert report == RoomReport(room="lab", celsius=21.5, comfortable=True), report
print("OK p09: structured_response is a RoomReport")
