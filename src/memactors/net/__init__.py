"""The listeners every HTTP and websocket surface serves on (the gateway, the operator RPC, /metrics).

``listen``: capped TCP listeners and hypercorn's trio worker with its clocks; ``asgi``: the small ASGI
helpers and the request-body guard in front of every app. May import: the standard library, trio,
hypercorn and ``memactors.logs``; nothing else of memactors (every surface imports this, not the reverse).
"""
