"""The agents' link, the control plane's end: ``consumer`` (the websocket at /agent/ each
node dials, and what it does with each message), ``heartbeats`` (kept in memory, written
in batches) and ``liveness`` (a node's stored state following its last heartbeat)."""
