"""What runs: nodes, replicas and shards, and everything that keeps them as the catalog
wants. Stands on catalog, audit, placement, core and protocol.

Rooms, on floors: a room imports only rooms on floors below its own.

1. ``models``; ``traffic`` (the routers' counts, from Redis); ``templatetags``; ``apps``.
2. ``transitions`` (the state machines' compare-and-swap), ``leadership``, ``pki/`` (link
   tokens, llmgw's certificate authority, the checks of a node's certificate),
   ``weights_map``, ``history``, ``routing_table`` (what routers load), ``metrics``, and
   ``api/`` (the read-only REST API for nodes, replicas and shards).
3. ``commands`` (down to nodes) and ``planning/`` (what the fleet would do, worked out
   without doing it: the placement snapshot, shard specs, a crash loop's backoff, the
   deploy plan).
4. ``actions/``: the verbs, every change to the fleet's rows, each naming who acted; and
   ``selectors`` (the reads pages and the API share).
5. What calls the verbs: ``link/`` (the agents' websocket, batched heartbeats, liveness),
   ``reconcile/`` (the reconciler's passes, rollout, autoscale, engines told) and
   ``pages/`` (the operators' pages, their buttons, live fragments and sockets, sign-in).
6. ``ctl/`` (``llmgw_ctl``'s fleet commands, one module per family), ``tasks`` (the beat
   tasks), ``websockets`` (the link's and pages' socket routes) and ``admin``.
"""
