"""The operator RPC: MemoryService as JSON frames over a websocket.

The contract (docs/operations.md, "RPC"):

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

The modules, one concept each: ``frames`` (what both ends share: limits, tiers, codes, `RpcError`,
`encode_frame`), ``tokens`` (the operator bearer tokens), ``server`` (`serve_rpc`), ``client``
(`connect_rpc`, `RpcClient`: the trio client), ``methods`` (the method table: each method's name, tier and
typed parameters, over the service's handlers) and ``wsclient`` (the blocking one-call client the CLI's read
commands use, standard library only). Callers import the module that defines a name. A surface: it may
import the service (``methods`` only) and the pure modules; nothing below imports it. This ``__init__``
stays empty so that ``wsclient`` costs no more than the standard library.
"""
