"""What should run: models, profiles, engines, pools, fabrics, teams and API keys, and the
verbs that change them. Stands on audit, core and protocol; never imports fleet.

Rooms, on floors: a room imports only rooms on floors below its own.

1. ``fit/`` (the memory a model needs, from its own file: pure helpers), ``permissions``,
   ``apps``.
2. ``models``: the rows, and the facts derived from them.
3. ``schema`` (a catalog file, validated) and ``keys`` (how API keys are drawn, stored and
   limited).
4. ``plan`` (what applying a file would change), ``serializers``, ``api_errors``, and
   ``teams/`` (who may do what in a team, the teams' verbs, ``/api/v1/teams/`` and
   ``llmgw_ctl teams``; it needs only keys and models, and the key verbs ask it who may).
5. ``actions/``: the verbs, every change to the catalog's rows, each naming who acted.
6. What calls the verbs: ``api`` (REST), ``admin``, ``ctl`` and ``ctl_keys``
   (``llmgw_ctl``), ``playground`` (a page's short-lived key) and ``tasks`` (the Celery
   task that reads a model's file).
7. ``tokens/``: the REST API's tokens, stored hashed with an expiry (how they are checked,
   their verbs, ``llmgw_ctl api-tokens``).
"""
