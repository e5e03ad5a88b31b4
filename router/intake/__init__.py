"""A request before a replica is chosen: ``call`` (the request as the router carries it,
read off the wire), ``auth`` (API keys), ``limits`` (per-key limits, shared through
Redis), ``body_checks`` (what an engine cannot use), ``cors`` (browser origins) and
``request_ids`` (one id per request, and its log line)."""
