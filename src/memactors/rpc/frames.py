"""What both ends of the operator RPC share: the endpoint, the frame size and in-flight limits, the two
tiers, the error codes a reply may carry, `RpcError`, and how a request frame is written
(`encode_frame`). The contract itself is the ``rpc`` package's docstring."""

from __future__ import annotations

import json
from typing import Any, Literal

from ..errors import MemactorsError

Tier = Literal["read", "control"]
TIERS: tuple[Tier, ...] = ("read", "control")

#: The websocket path MemoryService is served on.
ENDPOINT_PATH = "/harness.v1"
#: Largest frame either side accepts; a bigger one closes the connection (code 1009).
MAX_MESSAGE_SIZE = 4 * 1024 * 1024
#: Requests one connection may have in flight before the server stops reading from it.
MAX_IN_FLIGHT = 16

#: gRPC code names that may appear in an error reply. ``OK`` is never sent.
CODES = frozenset(
    {
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    }
)


class RpcError(MemactorsError):
    """Raised by ``RpcClient`` when the daemon answers with an error or cannot be reached.

    ``code`` is the gRPC code name the daemon returned (or ``UNAVAILABLE`` / ``UNAUTHENTICATED``
    for a connection that could not be made), so a CLI can map it to an exit status.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def encode_frame(doc: Any) -> str:
    """A request as the client sends it: compact JSON, non-ASCII text as itself (a frame's size is then
    its UTF-8 size, which is what `runs ingest` budgets batches by), NaN and Infinity refused.

    A string holding a lone surrogate cannot travel as UTF-8: such a frame falls back to ``\\u``
    escapes, so the daemon receives it and refuses the field by name instead of the client crashing.
    """
    frame = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        frame.encode("utf-8")
    except UnicodeEncodeError:
        frame = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    return frame
