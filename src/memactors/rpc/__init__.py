"""The operator RPC: MemoryService over a websocket (``ws://<operator listen>/harness.v1``).

``transport``: the contract, over ``frames`` (limits, tiers, codes, `RpcError`), ``tokens``, ``server`` and
``client`` (the trio client); ``methods``: the method table,
each method's name, tier and typed parameters, over the service's handlers; ``wsclient``: the blocking
one-call client the CLI's read commands use (standard library only). A surface: it may import the
service (``methods`` only) and the pure modules; nothing below imports it. This ``__init__`` stays
empty so that ``wsclient`` costs no more than the standard library.
"""
