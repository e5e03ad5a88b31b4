"""The bottom floor under every app: environment parsing, the Redis client, tables,
humanize (bytes, durations) and the control plane's outbound HTTP client. No models;
it imports nothing of llmgw's."""
