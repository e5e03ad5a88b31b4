"""Requests and tokens per key, model and hour: ``accounting`` (counted by the proxy,
written in batches to ``router.models.Usage``), ``report`` (read back per day, or per
team), ``cost`` (what owned hardware cost each team, read by the control plane: never
in a router), ``ctl`` (``llmgw_ctl usage``) and ``views`` (the usage page). The model stays in
``router/models.py``, where Django looks for the app label ``router``."""
