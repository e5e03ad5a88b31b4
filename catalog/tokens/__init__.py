"""The REST API's tokens (``Authorization: Token …`` on ``/api/v1/``), stored hashed, each
with an expiry. Rooms, lowest first: ``stored`` (how a token is drawn, stored and checked:
the authentication class the API's settings name), ``actions`` (the verbs: issue one to an
account, revoke one) and ``ctl`` (``llmgw_ctl api-tokens``)."""
