"""The processor, read from a /proc/cpuinfo the test writes."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from fakes.nvml import no_library

from agent_worker.discovery import DiscoveryConfig, HostSources, discover
from agent_worker.discovery.cpu import NO_AVX2, cpu_warnings, discover_cpu

X86_FLAGS = "fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 avx512f avx512bw avx512_vnni"
QEMU64_FLAGS = "fpu vme sse sse2 ssse3 sse4_1 sse4_2 pni"
ARM_FEATURES = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp asimddp sve sve2"


def x86_cpuinfo(flags: str, processors: int = 4, model: str = "AMD EPYC 9654") -> str:
    block = "processor\t: {n}\nvendor_id\t: AuthenticAMD\nmodel\t\t: 17\n"
    block += f"model name\t: {model}\nflags\t\t: {flags}\n\n"
    return "".join(block.format(n=n) for n in range(processors))


def arm_cpuinfo(processors: int = 2) -> str:
    block = "processor\t: {n}\nBogoMIPS\t: 50.00\nFeatures\t: " + ARM_FEATURES + "\n"
    block += "CPU implementer\t: 0x41\nCPU part\t: 0xd40\n\n"
    return "".join(block.format(n=n) for n in range(processors))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return path


def test_x86_model_cores_and_extensions_are_read(tmp_path):
    cpu = discover_cpu(write(tmp_path, x86_cpuinfo(X86_FLAGS, processors=6)), arch="x86_64")

    assert cpu.model == "AMD EPYC 9654"
    assert cpu.cores == 6
    assert cpu.arch == "x86_64"
    assert cpu.vector_extensions == [
        "sse4_2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512_vnni",
    ]
    assert cpu_warnings(cpu) == []


def test_x86_without_avx2_is_warned_about(tmp_path):
    cpu = discover_cpu(
        write(tmp_path, x86_cpuinfo(QEMU64_FLAGS, model="QEMU Virtual CPU")), "x86_64"
    )

    assert cpu.vector_extensions == ["sse4_2"]
    assert cpu_warnings(cpu) == [NO_AVX2]
    assert "five times slower" in NO_AVX2


def test_arm_reports_neon_and_sve_and_no_avx2_warning(tmp_path):
    cpu = discover_cpu(write(tmp_path, arm_cpuinfo(processors=2)), arch="aarch64")

    assert cpu.vector_extensions == ["neon", "sve", "sve2", "dotprod"]
    assert cpu.cores == 2
    assert "0xd40" in cpu.model
    assert cpu_warnings(cpu) == []


def test_unreadable_cpuinfo_falls_back_to_the_cpu_count(tmp_path):
    cpu = discover_cpu(tmp_path / "missing", arch="x86_64")

    assert cpu.cores == (os.cpu_count() or 1)
    assert cpu.vector_extensions == []


def test_discovery_logs_a_missing_avx2_loudly(tmp_path, caplog):
    cpuinfo = write(tmp_path, x86_cpuinfo(QEMU64_FLAGS))
    host = HostSources(cpuinfo=cpuinfo, infiniband=tmp_path / "no-ib", arch="x86_64")
    config = DiscoveryConfig(weights_dir=tmp_path / "weights", address="10.0.0.5")

    with caplog.at_level(logging.WARNING):
        inventory = discover(config, host=host, nvml=no_library())

    assert NO_AVX2 in inventory.warnings
    assert any(r.levelno == logging.WARNING and NO_AVX2 in r.getMessage() for r in caplog.records)
