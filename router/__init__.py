"""The `/v1` proxy: an ASGI app that reads the routing snapshot (``protocol.routing``)
and sends each request to a ready replica. It never writes the catalog.

A request for a model reads top-down in three files: ``app`` (``Router.inference``),
``intake/reception.py`` (every check, until a replica can take it: a ``Call``) and
``forward/proxy.py`` (the call sent to a replica, its answer relayed back).

Rooms (each subpackage and each module here), on floors, the lowest first: a room imports
only rooms on the lines before its own, so none imports another back.

- ``errors``: the router's own refusals, in OpenAI's shape.
- ``config``: the knobs, from the environment.
- ``traffic``: what this router served per model since its last report (the model page).
- ``metrics``: its Prometheus metrics.
- ``models``, ``apps``: the Django app (label ``router``) and its ``router_usage`` table.
- ``wire/``: the bytes on the router's sockets: the one way out to engines (``upstream``,
  one ``connection`` and its answer), the usage they report (``tokens``), and the way in:
  the router's own HTTP/1.1 server (``server``) and its serving loop (``serving``).
- ``usage/``: requests and tokens per key and model: counted and written in batches
  (``accounting``), read back as a report (per team too, with its cost: ``cost``),
  ``llmgw_ctl usage`` and the usage page.
- ``table/``: what can be routed to: the routing table (``routes``), the key set
  (``keys``), where both come from (``sources``), the last good table on disk (``saved``),
  the health probe of the engines a saved table names (``probe``), and the table and
  keys in use, swapped whole on every load (``keeper``).
- ``translate/``: Anthropic's Messages and OpenAI's Responses served on chat completions.
- ``responses``: small ASGI answers: JSON, the router's errors, /v1/models entries.
- ``conversations/``: Responses conversations kept for ``previous_response_id`` where the
  engine keeps none: the store (Redis with a TTL), a request's conversation put into its
  input and its answer kept (``chains``), a kept response's GET and DELETE (``answers``).
- ``balance/``: which replica takes a request: least outstanding and breakers
  (``balancer``), prefix and session affinity, the waiting rooms, which replica made a
  Responses answer, and the in-flight report to the control plane.
- ``intake/``: a request before a replica is chosen: every check in order (``reception``),
  read off the wire (``call``, ``uploads``), per-key limits (``limits``, over the
  ``counters`` in Redis or in memory, the scripts of a loop's turn sent together:
  ``script_batch``), the body, CORS, request ids.
- ``forward/``: sending a call to the replica and relaying its answer (``proxy``,
  ``relay``), carrying a broken stream on elsewhere (``migration``), counting what an
  unfinished answer served (``counting``), and a stored
  response's GET or DELETE (``stored``: the router's own, else the engine's).
- ``endpoints``: /v1/models, /health, /metrics and a browser's CORS preflight.
- ``app``: the ``Router``: its parts, built once, and a request dispatched by its path.
- ``asgi``: the entry point (an ASGI application) that ``serve`` runs.
- ``serve``: its own server (``wire/server``) serving it, one process or several on one port.
"""
