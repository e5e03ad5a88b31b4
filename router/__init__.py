"""The `/v1` proxy: an ASGI app that reads the routing snapshot (``protocol.routing``)
and sends each request to a ready replica. It never writes the catalog.

Rooms (``app`` walks a request through them, in one place):

- ``intake/``: reading a request off the wire (``call``) and what is checked before a
  replica is chosen: the key (``auth``), its limits, the body, CORS, the request id.
- ``table/``: what can be routed to: the routing table (``routes``), where it and the
  keys come from (``sources``), the last good table on disk (``saved``) and the health
  probe of the engines a saved table names (``probe``).
- ``balance/``: which replica takes a request: least outstanding and breakers
  (``balancer``), prefix and session affinity, the waiting room, where a Responses answer
  was made, and the in-flight report to the control plane.
- ``forward/``: sending a call to the replica and relaying its answer (``proxy``,
  ``relay``, ``upstream``, the one way out), carrying a broken stream on elsewhere
  (``migration``), the tokens read out of answers.
- ``translate/``: Anthropic's Messages and OpenAI's Responses served on chat completions.
- ``usage/``: requests and tokens per key and model: counted by the proxy and written in
  batches (``accounting``), read back as a report, ``llmgw_ctl usage`` and the usage page.

At the top: ``asgi`` (the entry point uvicorn serves) and ``app`` (the ``Router``),
``config`` (the knobs, from the environment), ``errors``, ``responses`` (small ASGI
answers), ``metrics``; and the Django app, ``apps`` and ``models`` (the ``router_usage``
table), which stay here for the app label ``router``.
"""
