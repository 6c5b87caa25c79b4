"""The agent side: what memactors needs to start an agent, watch it and turn what it did into a run record.

``prompt``: the fence around untrusted text (REQ-16, REQ-20); ``run_process``: the child process and its plumbing;
``run_watch``: the event log and stderr tail; ``run_record``: the record of a supervised run;
``excerpt_repair``: a start-up repair of stored excerpts; ``transcript``: a resident's transcript to a run record;
``spool``: records a hook could not hand to the daemon. The per-agent parsers are ``memactors.adapters``.
Used by the runs actor (``actors/runs.py``) and the CLI's hooks. May import: ``memactors.adapters``,
``memactors.store`` and the pure modules; never the actors, the service or a surface. This ``__init__``
stays empty: the CLI's hooks import ``spool`` and ``transcript`` without the rest.
"""
