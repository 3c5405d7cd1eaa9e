"""``FilesystemBackend`` at the reference's path (``deepagents.backends.filesystem``)."""

from .._backends import FilesystemBackend

__all__ = ["FilesystemBackend"]
