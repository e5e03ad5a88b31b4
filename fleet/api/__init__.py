"""The fleet's REST API, read-only: ``views`` (viewsets for nodes, replicas and shards) and
``serializers``. The Event log's API is ``audit.api``."""
