"""The reconciler: make the fleet match the catalog, one pass at a time.

``passes`` (the pass and its steps), ``rollout`` (rolling restarts of stale replicas),
``autoscale`` (wanted replicas following demand), ``backoff`` (a crash loop's wait),
``snapshot`` (the fleet as placement sees it), ``shard_specs`` (what a node is told to
run), ``engines`` (telling nodes which engine versions to have) and ``report`` (what one
pass did). The beat tasks that run a pass are ``fleet.tasks``.
"""
