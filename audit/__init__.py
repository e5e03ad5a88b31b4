"""What happened, and who was told: the Event log, ``record_event``, and the notices that
go out once a change commits (open pages, routers). Catalog and fleet both stand on it;
it imports nothing of theirs."""
