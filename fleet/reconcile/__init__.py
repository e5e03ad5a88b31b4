"""The reconciler: make the fleet match the catalog, one pass at a time.

``passes`` (the pass and its steps), ``rollout`` (rolling restarts of stale replicas),
``autoscale`` (wanted replicas following demand), ``engines`` (telling nodes which engine
versions to have) and ``report`` (what one pass did). What it works out before acting
(the placement snapshot, shard specs, a crash loop's backoff) is ``fleet.planning``'s;
what it changes goes through the verbs of ``fleet.actions``. The beat tasks that run a
pass are ``fleet.tasks``.
"""
