"""Teams (issue 43): people with a role each (viewer, member, lead), the keys they spend
through, the models open to them and their budgets. Rooms, lowest first: ``roles`` (finding
a team, who may do what in it), ``actions`` (the verbs: make and change teams, give roles,
open models to teams), ``api`` (``/api/v1/teams/``) and ``ctl`` (``llmgw_ctl teams``).
A team's keys are made by ``catalog.actions.api_keys``; what routers load of a team travels
with its keys (``catalog.keys.active_keys``)."""
