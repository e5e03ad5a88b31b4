"""What the router can route to: ``routes`` (the routing table, built from a snapshot),
``keys`` (the API keys, checked per request), ``sources`` (the database or a static file,
kept fresh), ``saved`` (the last good table on disk, for a start while the database is
down), ``probe`` (which engines a saved table names still answer) and ``keeper`` (the
table and keys in use, swapped whole on every load)."""
