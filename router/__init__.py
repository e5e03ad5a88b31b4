"""The `/v1` proxy: an ASGI app that reads the routing snapshot (``protocol.routing``)
and sends each request to a ready replica. It never writes the catalog."""
