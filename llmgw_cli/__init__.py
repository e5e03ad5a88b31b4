"""The entry points: `llmgw up`, the embedded PostgreSQL and Redis, the demo model and
`llmgw_ctl`'s dispatcher. They start what the settings then read; nothing below imports
this package.

Rooms, on floors: a room imports only rooms on floors below its own.

1. ``demo`` (the demo models), ``local_engine`` (the llama-server in llmgw's own
   environment), ``listener`` (one socket for several daphnes) and ``supervise`` (child
   processes and their logs).
2. ``embedded`` (PostgreSQL and Redis from wheels).
3. ``up`` (`llmgw up`), ``sim/`` (`llmgw sim`), ``celery`` (the control plane's app with
   the embedded services) and ``pytest_plugin``.
4. ``cli`` (the `llmgw` command) and ``management/`` (`manage.py`'s commands).
"""
