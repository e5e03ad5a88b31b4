"""The processor, from /proc/cpuinfo: model, logical cores and the vector extensions that
decide which engine build runs and how fast."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from protocol.inventory import Cpu

CPUINFO = Path("/proc/cpuinfo")

# Extensions that change which build an engine should use or how fast it runs, in the order
# they are reported. Names are the kernel's flag names.
X86_EXTENSIONS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
# On ARM the kernel calls NEON "asimd"; report it by the name people search for.
ARM_EXTENSIONS = {
    "asimd": "neon",
    "neon": "neon",
    "sve": "sve",
    "sve2": "sve2",
    "asimddp": "dotprod",
}

NO_AVX2 = "CPU has no AVX2: llama.cpp will run about five times slower; check the VM's CPU type"


def discover_cpu(cpuinfo: Path = CPUINFO, arch: str | None = None) -> Cpu:
    """Describe the processor from `cpuinfo`; `arch` defaults to this machine's."""
    arch = arch or platform.machine()
    try:
        text = cpuinfo.read_text()
    except OSError:
        text = ""
    fields = _first_values(text)
    cores = sum(1 for key, value in _pairs(text) if key == "processor" and value.isdigit())
    return Cpu(
        model=_model(fields, arch),
        cores=cores or os.cpu_count() or 1,
        arch=arch,
        vector_extensions=_vector_extensions(fields, arch),
    )


def cpu_warnings(cpu: Cpu) -> list[str]:
    """Return what an operator should know about this processor."""
    if cpu.arch in ("x86_64", "amd64") and "avx2" not in cpu.vector_extensions:
        # A VM given a generic CPU type (qemu64, kvm64) hides AVX2 and nothing else looks wrong.
        return [NO_AVX2]
    return []


def _first_values(text: str) -> dict[str, str]:
    """Map each key to its first value; every processor block repeats the same keys."""
    fields: dict[str, str] = {}
    for key, value in _pairs(text):
        fields.setdefault(key, value)
    return fields


def _pairs(text: str) -> list[tuple[str, str]]:
    pairs = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            pairs.append((key.strip().lower(), value.strip()))
    return pairs


def _model(fields: dict[str, str], arch: str) -> str:
    for key in ("model name", "cpu model", "model", "hardware", "cpu"):
        if fields.get(key) and not fields[key].isdigit():
            return fields[key]
    if "cpu implementer" in fields:
        return f"{arch} (implementer {fields['cpu implementer']}, part {fields.get('cpu part')})"
    return platform.processor() or arch


def _vector_extensions(fields: dict[str, str], arch: str) -> list[str]:
    flags = set((fields.get("flags") or fields.get("features") or "").split())
    if arch.startswith(("arm", "aarch")):
        return list(dict.fromkeys(name for flag, name in ARM_EXTENSIONS.items() if flag in flags))
    return [flag for flag in X86_EXTENSIONS if flag in flags]
