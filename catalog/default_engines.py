"""The engine builds a catalog gets without naming any (rule R103), and where each engine
version a node may run comes from.

llama.cpp's default is xllamacpp from PyPI: llama.cpp's own server compiled into a wheel
(about 34 MB, no dependencies), run by llmgw's launcher with llama-server's flags. It
installs in seconds where compiling llama-server from source took eight minutes on two
cores, and it is pinned by version and by the sha256 of each platform's wheel, which the
agent's pip checks (``--require-hashes``). It has no RPC backend: a profile across nodes
on it is refused at apply, with the way out.

A default stands for its engine only while the catalog names no version of that engine:
``engines:`` with a llama.cpp build replaces it (and nodes then remove it once no shard
runs on it). ``LLMGW_DEFAULT_ENGINES=0`` turns the defaults off.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings

from protocol.engines import EngineBuild, WantedEngine

XLLAMACPP = "2026.10.11549"
DEFAULT_LLAMA_CPP = WantedEngine(
    name="llama.cpp",
    version=f"xllamacpp-{XLLAMACPP}",
    builds=[
        EngineBuild(
            name="xllamacpp-cpu-x86_64", pip=f"xllamacpp=={XLLAMACPP}",
            sha256="c54e7d13520ecc989c63dc99d55de3065e2f343a91f43f053d16b5e62077c261",
            platform="linux-x86_64",
        ),
        EngineBuild(
            name="xllamacpp-cpu-aarch64", pip=f"xllamacpp=={XLLAMACPP}",
            sha256="e2a3e79e775515de4ad197e667f874070446ef9ac9cf2044bc9866bc4c72289e",
            platform="linux-aarch64",
        ),
    ],
)  # fmt: skip
DEFAULT_ENGINES = (DEFAULT_LLAMA_CPP,)

# Where an engine version comes from, in words pages and llmgw_ctl show.
FROM_DEFAULT = "default"
FROM_CATALOG = "catalog"
FROM_NODE = "found on the node"


def default_engines(named: Iterable[str]) -> list[WantedEngine]:
    """The defaults of the engines not in ``named`` (the engine names the catalog gives
    versions of); none when LLMGW_DEFAULT_ENGINES is off."""
    if not settings.DEFAULT_ENGINES:
        return []
    names = set(named)
    return [engine for engine in DEFAULT_ENGINES if engine.name not in names]


def is_default(engine: str, version: str) -> bool:
    """Whether ``engine`` ``version`` is one of llmgw's defaults (switched on or not)."""
    return any(d.key == (engine, version) for d in DEFAULT_ENGINES)


def spans_nodes_problem(engine: str, version: str, nodes: int) -> str | None:
    """Why a profile over ``nodes`` nodes cannot run on ``engine`` ``version``, when that
    is the prebuilt default; None when it can (or is not the default's to say)."""
    if nodes <= 1 or not is_default(engine, version) or engine != DEFAULT_LLAMA_CPP.name:
        return None
    return (
        f"nodes: {nodes} splits the model over llama.cpp's RPC backend, which the default "
        f"llama.cpp ({version}, prebuilt from PyPI) does not have; pin engine_version: to a "
        "llama.cpp build with rpc-server (one named under engines:, or one the agent files "
        "name: `make engines` builds one from source), or set nodes: 1"
    )
