"""What the router can route to: ``routes`` (the routing table, built from a snapshot),
``sources`` (the database or a static file, kept fresh), ``saved`` (the last good table
on disk, for a start while the database is down) and ``probe`` (which engines a saved
table names still answer)."""
