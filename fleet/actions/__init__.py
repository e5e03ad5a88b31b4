"""The fleet's verbs: every change to its rows.

``nodes`` (drain, pool), ``replicas`` (create, start, drain, stop, restart),
``certificates`` (issue, revoke) and ``reports`` (what agents report over their link).
Each verb is one transaction that records its Event, naming who acted (its keyword-only
``actor``: an operator, or one of llmgw's own parts from ``audit.actors``), and tells
pages (and routers, where it changes what they serve) once it commits. Views, the admin,
the REST API, `llmgw_ctl`, the agent link and the reconciler call these; the catalog's
verbs are in ``catalog.actions``.
"""
