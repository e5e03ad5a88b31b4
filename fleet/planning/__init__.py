"""What the fleet would do, worked out without doing it: below both the verbs and the
reconciler, so each reads the same answers.

``snapshot`` (the fleet as placement sees it, and a profile's placement request),
``shard_specs`` (what a node is told to run for one shard, and its port), ``backoff`` (a
crash loop's wait before a failed replica is replaced) and ``deploy`` (what deploying or
changing a model would do now, shown before it is done).
"""
