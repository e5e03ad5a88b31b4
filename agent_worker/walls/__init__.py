"""The node's firewall around its engines: each shard's ports admit only those who need
them (docs/security.md, "Engine ports: who may reach them")."""

from agent_worker.walls.keeper import Walls, is_loopback
from agent_worker.walls.rules import WallError

__all__ = ["WallError", "Walls", "is_loopback"]
