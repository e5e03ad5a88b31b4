"""A process holding a GPU that llmgw neither started nor may kill (sent in `register`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class UnexpectedGpuUser(BaseModel):
    """Describe a GPU holder no shard accounts for and the agent left running.

    Another user's job, a desktop's graphics, or a program of the agent's own user that
    is not an engine llmgw runs: its GPUs are busy, so an operator has to hear of it, but
    it is not the agent's to stop.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    pid: int = Field(ge=1)
    user: str = Field(description="owner's name, or the uid as digits when it has none")
    name: str = Field(description="process name as the kernel shows it (at most 15 chars)")
    cmdline: str = Field(description="command line, cut to about 200 characters")
