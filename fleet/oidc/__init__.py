"""Sign-in through an OpenID Connect provider (docs/sign-in.md).

mozilla-django-oidc runs the flow (authorization code with PKCE, the ID token checked
against the provider's keys); this package adds what it lacks: the provider's endpoints
from its discovery document (``provider``), the ID token's issuer and audience checked
(``backend``), and roles from a claim (``roles``). The pages' views are
``fleet.pages.oidc``; the account and its roles change through ``fleet.actions.sign_ins``.
"""
