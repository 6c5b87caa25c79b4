"""The supervised actors of memactors, one module each (see docs/architecture.md), and their kernel.

``kernel``: mailboxes, addresses, ask/tell and the one-for-one supervisor; one module per actor
(``provider_session``, ``call_log``, ``index``, ``summary``, ``assembler``, ``retention``, ``briefing``,
``runs``) with its helpers beside it (``breaker``, ``view``, ``run_state``, and
``spawn``: what a run's briefing and prompt need before its process starts, also the embedding API's
`prepare_spawn`). May import: the built-in provider, the agent side, the store and the pure
modules; never the service or a surface.
"""
