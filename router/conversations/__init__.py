"""Responses conversations the router keeps for engines that keep none: the store (Redis
with a TTL, and a copy in memory: ``store``), a request's conversation put into its input
and its answer kept (``chains``), and a kept response's GET and DELETE (``answers``)."""
