"""The catalog's verbs: every change to its rows, each one transaction that records its
Event (naming who acted: an operator, or one of llmgw's parts from ``audit.actors``) and
tells routers and open pages once it commits. The REST API, ``llmgw_ctl``, the pages and
the reconciler call these and never save catalog rows themselves.

``entries`` (apply a catalog file or one model from a page; create, update or delete one
engine, pool, fabric, model or profile), ``profiles`` (scale a profile, note its low
demand, pause and resume a model's rollout), ``api_keys`` (create, update and revoke API
keys), ``shapes`` (learn what a model's file says of the memory it needs) and, under
them all, ``changes`` (how a change is recorded and announced). Teams' verbs are in
``catalog.teams.actions``; the fleet's are in ``fleet.actions``.
"""
