"""The Python anchor of bench/harness.sh: one plain run of deepagents (Python) against aimock.

One user message, then the model (aimock, fixtures loaded by bench/harness/bench.py) drives N
tool calls on the default StateBackend and ends with a text answer. Prints the final answer.
Usage: python bench/harness/run_python.py --n N --base-url http://127.0.0.1:PORT/v1
"""

import argparse
import sys

from deepagents import create_deep_agent
from langchain_openai import ChatOpenAI

# Kept in step with bench/harness/bench.py (TASK) and the `deepagents run` call in
# bench/harness.sh.
TASK = "Run the harness benchmark: follow the tool calls you are given. [harness-bench]"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, required=True, help="tool-calling model turns")
    parser.add_argument("--base-url", required=True, help="aimock's OpenAI endpoint, .../v1")
    parser.add_argument(
        "--context-window",
        type=int,
        default=0,
        help="the model profile's max_input_tokens (0: langchain-openai's profile for gpt-4o)",
    )
    parser.add_argument(
        "--streaming",
        action="store_true",
        help="streaming Chat Completions requests (langchain-openai's default is non-streaming)",
    )
    args = parser.parse_args()

    options = {"model": "gpt-4o", "base_url": args.base_url, "api_key": "test"}
    if args.streaming:
        options["streaming"] = True
    model = ChatOpenAI(**options)
    if args.context_window > 0:
        # The same model with a larger window in its profile, which sets where deepagents'
        # summarization and argument truncation start.
        profile = dict(model.profile or {})
        profile["max_input_tokens"] = args.context_window
        model = ChatOpenAI(**options, profile=profile)
    agent = create_deep_agent(model=model)
    # Model turns and tool steps are graph steps; leave room well above N+1 turns.
    result = agent.invoke(
        {"messages": [{"role": "user", "content": TASK}]},
        config={"recursion_limit": 20 * (args.n + 10)},
    )
    final = result["messages"][-1]
    text = final.content if isinstance(final.content, str) else str(final.content)
    print(text)
    return 0 if text.strip() else 1


if __name__ == "__main__":
    sys.exit(main())
