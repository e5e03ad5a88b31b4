"""The node agent: discovery, heartbeats, engines and weights on one node. It never imports
Django and speaks to the control plane only through ``protocol``.

Rooms, on floors: a room imports only rooms on floors below its own.

1. ``discovery/`` (what the node has), ``weights/`` (weights fetched and found),
   ``agent_state`` (what survives a restart), ``identity`` (the node's certificate) and
   ``logbuffer`` (the last lines of every log).
2. ``config`` (the agent file), ``engines/`` (adapters, probing, installs) and ``link``
   (the websocket up to the control plane).
3. ``supervision/`` (engine processes: start, adopt, health, logs), ``node_engines`` and
   ``node_weights`` (what the node has of each, told when it changes).
4. ``supervisor``, then ``launcher`` (weights first, then the engine), then ``runtime``
   (the one instance for the worker's whole life).
5. ``tasks`` (the commands down from the control plane) and ``bootstep``, then ``celery``
   (the app).
"""
