"""``llmgw sim``: a fleet on one machine, each host in Linux network namespaces of its own.

``network`` makes the bridge, namespaces, links and faults; ``hosts`` says what runs
where; ``services`` starts PostgreSQL and Redis on their host; ``operator`` is what an
operator runs once on a control plane; ``fleet`` brings it all up and down and records it;
``cleanup`` removes whatever a sim left, crashed or not; ``command`` is the command line.
"""
