"""An OpenID Connect provider for the sign-in tests: django-oauth-toolkit with OIDC on, in
a Django project of its own, run as its own process on its own port and SQLite file
(``fixture.py`` starts it). It signs ID tokens with an RSA key made for the test run, asks
for PKCE, and puts each user's groups in a ``groups`` claim."""
