"""Reading the audit log: who may read which Events, and (once teams exist) a team's.
Shared by the audit page, its exports, the REST API and ``llmgw_ctl events``."""
