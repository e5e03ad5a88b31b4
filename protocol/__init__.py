"""The bottom floor: typed contracts every side shares (link messages, node commands, the
routing snapshot and its channel, shard specs, units, signing). Pydantic and the standard
library only; it imports nothing of llmgw's."""
