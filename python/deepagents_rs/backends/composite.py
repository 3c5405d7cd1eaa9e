"""``CompositeBackend`` at the reference's path (``deepagents.backends.composite``)."""

from .._backends import CompositeBackend

__all__ = ["CompositeBackend"]
