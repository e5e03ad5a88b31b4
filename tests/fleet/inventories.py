"""Inventories as an agent would describe a node, for tests of the control plane."""

from __future__ import annotations

from protocol.inventory import Cpu, Gpu, Inventory


def inventory(
    node_id: str = "node01", gpus: int = 0, address: str = "10.0.0.1", **fields
) -> Inventory:
    fields.setdefault("memory_total", 64 << 30)
    fields.setdefault("firewall", "nftables")  # a current agent that walls engine ports
    return Inventory(
        hostname=node_id,
        address=address,
        os="Debian GNU/Linux 12",
        kernel="6.1",
        arch="x86_64",
        cpu=Cpu(model="Test CPU", cores=16, arch="x86_64", vector_extensions=["avx2"]),
        gpus=[
            Gpu(index=i, uuid=f"GPU-{i}", name="H100", memory_total=80 << 30, memory_used=0)
            for i in range(gpus)
        ],
        **fields,
    )
