"""The supervised actors of memactors, one module each (see docs/architecture.md), and their kernel.

``kernel``: mailboxes, addresses, ask/tell and the one-for-one supervisor. One module per actor, its
messages at the top: ``provider_session``, ``call_log`` (a supervised task that owns its bounded queue:
rows are told to it and it writes them in batches), ``index``, ``summary``, ``assembler``,
``retention``, ``briefing`` and ``runs``. ``spawn`` is the one helper here: what a run's briefing and
prompt need before its process starts (also the embedding API's `prepare_spawn`); it asks the briefing
actor and the runs actor calls it, so it has no home below the actors. What an actor uses but is not
one lives below: the breaker (``memactors.breaker``), who is reading (``memactors.view``), the served
documents (``memactors.documents``), a run's state (``memactors.agents.run_state``).

May import: the built-in provider, the agent side, the store and the pure modules; never the service or
a surface.
"""
