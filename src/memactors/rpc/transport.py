"""Operator RPC: MemoryService as JSON frames over a websocket.

The transport only; the handlers live with the service. The contract (docs/operations.md, "RPC"):

* Endpoint ``ws://<operator listen>/harness.v1``. Any other path is refused with HTTP 404.
* ``Authorization: Bearer <token>`` in the handshake selects the tier, ``read`` or ``control``
  (control may call everything). No or an unknown token: the handshake is refused with HTTP 401 and
  no method runs. Tokens live in ``operator-read.token`` / ``operator-control.token`` (mode 0600) in
  the state directory.
* Text frames: request ``{"id": str|int, "method": "harness.v1.MemoryService/Status", "params": {}}``,
  reply ``{"id", "result"}`` or ``{"id", "error": {"code", "message"}}`` with gRPC code names
  (``OK`` is never sent). A malformed frame gets ``INVALID_ARGUMENT`` with ``id: null`` when the id
  cannot be read or used (a string id longer than 128 characters or holding a control character or a
  lone surrogate, an integer id beyond 64 bits); an unknown method gets ``UNIMPLEMENTED``; a read-tier
  call of a control method gets ``PERMISSION_DENIED`` before its handler runs; a parameter the method
  does not take gets ``INVALID_ARGUMENT`` naming it, also before the handler. Whatever a frame holds,
  it gets an answer and the connection stays open.
* Requests on one connection are served concurrently (at most ``MAX_IN_FLIGHT`` at once; the reader
  stops reading while the limit is reached), so replies may arrive out of order and are matched by id.

A handler's ``MemactorsError`` crosses the wire as its ``.code`` and ``str(exc)``; any other exception
becomes ``INTERNAL`` with a generic message, and only its type is logged, because its arguments may
carry episode text or queries.

The transport is four modules, one concept each: ``frames`` (what both ends share: limits, tiers, codes,
`RpcError`, `encode_frame`), ``tokens`` (the operator bearer tokens), ``server`` (`serve_rpc`) and
``client`` (`connect_rpc`, `RpcClient`). Code in ``src/`` imports the module it needs; the names are
re-exported here for the scripts in ``bench/`` and the tests that import ``rpc.transport``.
"""

from __future__ import annotations

from .client import RpcClient as RpcClient
from .client import connect_rpc as connect_rpc
from .frames import CODES as CODES
from .frames import ENDPOINT_PATH as ENDPOINT_PATH
from .frames import MAX_IN_FLIGHT as MAX_IN_FLIGHT
from .frames import MAX_MESSAGE_SIZE as MAX_MESSAGE_SIZE
from .frames import RpcError as RpcError
from .frames import Tier as Tier
from .frames import encode_frame as encode_frame
from .server import MAX_DEPTH as MAX_DEPTH
from .server import Method as Method
from .server import peer_text as peer_text
from .server import serve_rpc as serve_rpc
from .tokens import Tokens as Tokens
from .tokens import ensure_tokens as ensure_tokens
from .tokens import read_token as read_token

__all__ = [
    "CODES",
    "ENDPOINT_PATH",
    "MAX_IN_FLIGHT",
    "MAX_MESSAGE_SIZE",
    "Method",
    "RpcClient",
    "RpcError",
    "Tier",
    "Tokens",
    "connect_rpc",
    "encode_frame",
    "ensure_tokens",
    "read_token",
    "serve_rpc",
]
