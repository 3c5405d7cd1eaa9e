"""FilesystemBackend in virtual mode: the agent's files are real files under one directory."""

import tempfile
from pathlib import Path

from deepagents import create_deep_agent
from deepagents.backends import FilesystemBackend
from langchain_openai import ChatOpenAI

MOCK_SCRIPT = [
    {"turns": [
        {"calls": [["write_file", {"file_path": "/reports/summary.txt", "content": "Q3 revenue grew 12%.\n"}]]},
        {"calls": [["read_file", {"file_path": "/reports/summary.txt"}]]},
        {"text": "I wrote and checked /reports/summary.txt."},
    ]},
]

with tempfile.TemporaryDirectory() as root:
    agent = create_deep_agent(
        model=ChatOpenAI(model="gpt-4o-mini"),
        backend=FilesystemBackend(root_dir=root, virtual_mode=True),
    )
    result = agent.invoke({"messages": [{"role": "user", "content": "Write the Q3 summary to /reports/summary.txt"}]})

    on_disk = Path(root) / "reports" / "summary.txt"
    assert on_disk.is_file(), sorted(p.name for p in Path(root).rglob("*"))
    assert on_disk.read_text() == "Q3 revenue grew 12%.\n", on_disk.read_text()
    read = [m for m in result["messages"] if m.type == "tool" and m.name == "read_file"]
    assert read and "Q3 revenue grew 12%." in read[0].content, read
    assert "summary.txt" in result["messages"][-1].content
print("OK p04: write_file landed on disk under root_dir")
