"""Sending a call to a replica and its answer back: ``proxy`` (retries, moves, tokens
counted), ``relay`` (the answer to the client, edited on its way, and noticing when the
client leaves), ``migration`` (carrying a broken stream on to another replica),
``counting`` (what an answer that ended early served, in tokens) and ``stored`` (a stored
Responses answer's GET or DELETE, relayed to the replica that made it). The way out to
engines is ``router.wire``."""
