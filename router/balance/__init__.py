"""Which replica takes a request: ``balancer`` (least outstanding requests, sessions,
breakers), ``prefix`` (the key that keeps a shared prompt prefix on one replica),
``waiting`` (each model's room of requests waiting for a replica, by priority),
``response_ids`` (which replica made a Responses answer) and ``inflight`` (what this
router carries, told to the control plane for rolling restarts)."""
