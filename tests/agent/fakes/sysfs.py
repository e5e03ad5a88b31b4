"""Build a fake /sys/class/infiniband under a temporary directory."""

from __future__ import annotations

from pathlib import Path

_STATE_NUMBERS = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
_SPEEDS = {10: "4X QDR", 25: "1X EDR", 56: "4X FDR", 100: "4X EDR", 200: "4X HDR", 400: "4X NDR"}


def add_adapter(
    root: Path,
    name: str,
    ports: dict[int, tuple[str, float | None]],
    interfaces: dict[str, str] | None = None,
    link_layer: str = "InfiniBand",
) -> Path:
    """Create adapter `name` with {port: (state, Gb/s)}; a rate of None leaves no rate file.

    `interfaces` maps the adapter's network interfaces (ib0) to their operstate ("up").
    """
    device = root / name
    (device / "ports").mkdir(parents=True)
    for number, (state, rate) in ports.items():
        port = device / "ports" / str(number)
        port.mkdir()
        (port / "state").write_text(f"{_STATE_NUMBERS[state]}: {state}\n")
        (port / "phys_state").write_text("5: LinkUp\n" if state != "DOWN" else "2: Polling\n")
        (port / "link_layer").write_text(f"{link_layer}\n")
        if rate is not None:
            speed = _SPEEDS.get(int(rate), "4X")
            (port / "rate").write_text(f"{rate:g} Gb/sec ({speed})\n")
    for interface, operstate in (interfaces or {}).items():
        netdev = device / "device" / "net" / interface
        netdev.mkdir(parents=True)
        (netdev / "operstate").write_text(f"{operstate}\n")
    return device
