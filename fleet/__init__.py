"""What runs: nodes, replicas and shards, and everything that keeps them as the catalog
wants. Stands on catalog, audit, placement, core and protocol.

Rooms:

- ``actions/``: the verbs, every change to the fleet's rows, each naming who acted.
- ``link/``: the agents' link (the websocket consumer), batched heartbeats, liveness.
- ``reconcile/``: the reconciler's passes, rollout, autoscale, backoff, the placement
  snapshot, shard specs and the engines nodes are told to have.
- ``pki/``: link tokens, llmgw's certificate authority, the checks of a node's certificate.
- ``pages/``: the operators' pages, their buttons, live fragments and sockets, sign-in.
- ``ctl/``: ``llmgw_ctl``'s fleet commands, one module per family.
- ``api/``: the read-only REST API for nodes, replicas and shards.

At the top: ``models``, ``transitions`` (the state machines' compare-and-swap),
``leadership``, ``commands`` (down to nodes), ``selectors`` (shared reads), ``history``,
``weights_map``, ``routing_table`` (what routers load), ``metrics``, ``websockets`` (the
link's and pages' socket routes), ``tasks``, ``admin`` and ``apps``.
"""
