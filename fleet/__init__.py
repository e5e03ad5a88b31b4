"""What runs: nodes, replicas and shards; the agents' link, liveness, the reconciler that
places replicas, the node and replica verbs (``fleet.actions``), the pages and metrics.
Stands on catalog, audit, placement, core and protocol."""
