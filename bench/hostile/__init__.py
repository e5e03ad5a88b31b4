"""The attacks of ``python -m bench.hostile_node``: one module per wall (the node's network,
the engine's user, the broker, the link), each yielding one ``Row`` per attempt."""
