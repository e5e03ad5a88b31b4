"""``llmgw sim``: a fleet on one machine, each host in Linux network namespaces of its own.

``network`` makes the bridge, namespaces, links and faults; ``impair`` slows and drops a
link's traffic; ``cleanup`` removes whatever a sim left, crashed or not; ``hosts`` says
what runs where; ``state`` is what ``state.json`` records and runs things on the hosts;
``probes`` waits for each part and reads the services; ``services`` starts PostgreSQL and
Redis on their host; ``fabric`` fakes InfiniBand adapters and a shared filer;
``operator`` is what an operator runs once on a control plane; ``fleet`` brings it all up
and down; ``command`` is the command line.
"""
