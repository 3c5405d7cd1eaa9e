"""``LocalShellBackend`` at the reference's path (``deepagents.backends.local_shell``)."""

from typing import Final

from .._backends import LocalShellBackend

DEFAULT_EXECUTE_TIMEOUT: Final = 120
"""Seconds a command may run unless the backend or the call says otherwise."""

__all__ = ["DEFAULT_EXECUTE_TIMEOUT", "LocalShellBackend"]
