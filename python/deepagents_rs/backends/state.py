"""``StateBackend`` at the reference's path (``deepagents.backends.state``)."""

from .._backends import StateBackend

__all__ = ["StateBackend"]
