"""A request before a replica is chosen: ``reception`` (every check, in the order clients
get their errors, and the ``Call`` a request becomes), ``call`` (the request as the router
carries it, read off the wire, and its body for the engine), ``uploads`` (a form's
``model``, the file streamed on), ``limits`` (per-key limits and budgets, reserved and
settled) over ``counters`` (in Redis, shared, or in memory), ``body_checks`` (what an
engine cannot use), ``cors`` (browser origins) and ``request_ids`` (one id per request,
and its log line). The key set is ``table.keys``."""
