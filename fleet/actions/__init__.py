"""The fleet's verbs: every change to its rows.

``nodes`` (drain, pool, engines told), ``liveness`` (a node silent, lost, or heard
again), ``replicas`` (create, start, fail, drain, stop, restart; why one is kept, how a
rollout stands), ``reports`` (what agents report of their node: register, engines,
weights), ``shard_reports`` (what they report of shards, and a replica's state from its
shards'), ``certificates`` (issue, revoke) and ``sign_ins`` (a lockout recorded).
Each verb is one transaction that records its Event, naming who acted (its keyword-only
``actor``: an operator, or one of llmgw's own parts from ``audit.actors``), and tells
pages (and routers, where it changes what they serve) once it commits. Views, the admin,
the REST API, `llmgw_ctl`, the agent link, the liveness check and the reconciler call
these; the catalog's verbs are in ``catalog.actions``.
"""
