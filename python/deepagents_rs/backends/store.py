"""``StoreBackend`` at the reference's path (``deepagents.backends.store``)."""

from .._backends import NamespaceFactory, StoreBackend

__all__ = ["NamespaceFactory", "StoreBackend"]
