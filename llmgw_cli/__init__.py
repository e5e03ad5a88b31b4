"""The entry points: `llmgw up`, the embedded PostgreSQL and Redis, the demo model and
`llmgw_ctl`'s dispatcher. They start what the settings then read; nothing below imports
this package."""
