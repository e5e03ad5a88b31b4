"""What many test modules share: ports, polling, processes, and the leftovers check."""
