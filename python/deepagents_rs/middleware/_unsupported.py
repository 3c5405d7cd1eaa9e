"""The reference's middleware names this package does not provide, and what to use."""

from __future__ import annotations

from typing import NoReturn

_FILES = "the file tools are built in: choose where files live with create_deep_agent(backend=…) and restrict them with permissions=[FilesystemPermission(…)]"
_SUMMARY = "the harness compacts the conversation itself when the context fills"
_ASYNC = "async subagents are built in: pass AsyncSubAgent specs ({'name', 'description', 'graph_id', 'url'}) or subagents with 'async': True to create_deep_agent(subagents=[…])"

ALTERNATIVES = {
    "FilesystemMiddleware": _FILES,
    "SubAgentMiddleware": "pass subagents=[{'name', 'description', 'system_prompt', …}] to create_deep_agent",
    "MemoryMiddleware": "pass memory=[paths of AGENTS.md files] to create_deep_agent",
    "SkillsMiddleware": "pass skills=[skill directories] to create_deep_agent",
    "SkillsState": "pass skills=[skill directories] to create_deep_agent",
    "SkillMetadata": "pass skills=[skill directories] to create_deep_agent",
    "SkillToolResolver": "pass skills=[skill directories] to create_deep_agent",
    "SummarizationMiddleware": _SUMMARY,
    "SummarizationToolMiddleware": _SUMMARY,
    "create_summarization_tool_middleware": _SUMMARY,
    "DEEPAGENTS_DEFAULT_SUMMARY_PROMPT": _SUMMARY,
    "AsyncSubAgentMiddleware": _ASYNC,
    "TaskEvent": _ASYNC,
    "PatchToolCallsMiddleware": "dangling tool calls are answered by the harness itself",
    "UnsupportedContentMiddleware": "not provided; the harness passes content blocks the model's provider takes",
}
for _name in (
    "RubricMiddleware",
    "RubricEvaluation",
    "RubricResult",
    "RubricState",
    "GraderResponse",
    "GraderVerdict",
    "CriterionEval",
    "CriterionFail",
    "CriterionPass",
    "GRADER_SYSTEM_PROMPT",
    "RUBRIC_GRADER_MESSAGE_SOURCE",
):
    ALTERNATIVES[_name] = "rubric grading is not provided"
for _name in (
    "HarnessProfile",
    "HarnessProfileConfig",
    "GeneralPurposeSubagentProfile",
    "register_harness_profile",
    "ProviderProfile",
    "register_provider_profile",
):
    ALTERNATIVES[_name] = "profiles are not provided; pass the model's settings and the subagents to create_deep_agent"


def unsupported(module: str, name: str) -> NoReturn:
    """Raises ``ImportError`` naming the alternative for a reference name this package lacks
    (``AttributeError`` for names the reference lacks too)."""
    if name in ALTERNATIVES:
        raise ImportError(f"deepagents_rs does not provide {name} (LangGraph middleware): {ALTERNATIVES[name]}")
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
