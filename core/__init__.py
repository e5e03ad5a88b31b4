"""The bottom floor under every app: environment parsing, the Redis client, tables,
humanize (bytes, durations), the control plane's outbound HTTP client, files written
whole, the mount table and GGUF headers. No models; it imports nothing of llmgw's.

Its rooms are modules of their own; only ``redis_clients`` stands on another
(``redis_urls``)."""
