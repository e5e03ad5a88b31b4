"""How a node proves who it is: ``tokens`` (a link token bound to the node's id),
``authority`` (llmgw's own CA: its key, node and server certificates) and ``verify`` (what
a link checks of a node's certificate, revocation included). Issuing and revoking
certificates are verbs, in ``fleet.actions.certificates``."""
