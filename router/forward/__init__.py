"""Sending a call to a replica and its answer back: ``proxy`` (retries, moves, tokens
counted), ``relay`` (the answer to the client, and noticing when it leaves),
``upstream`` (the router's one way out: HTTP/1.1 to engines), ``migration`` (carrying a
broken stream on to another replica) and ``tokens`` (usage read out of answers)."""
