"""The fleet's verbs: what an operator (or the reconciler) does to nodes and replicas.

Each verb is one transaction that records its Event, naming the operator who asked, and
tells pages (and routers, where it changes what they serve) once it commits. Views, the
REST API, `llmgw_ctl` and the reconciler call these; the catalog's verbs are in
``catalog.actions``.
"""
