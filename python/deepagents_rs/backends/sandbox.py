"""``BaseSandbox`` at the reference's path (``deepagents.backends.sandbox``): subclass it,
implement ``execute``, ``id``, ``upload_files`` and ``download_files``, and the file
operations follow (listing, glob, grep and delete run ``python3`` in the sandbox)."""

from .._protocol import ExecuteResponse, SandboxBackendProtocol
from .._sandbox import BaseSandbox

__all__ = ["BaseSandbox", "ExecuteResponse", "SandboxBackendProtocol"]
