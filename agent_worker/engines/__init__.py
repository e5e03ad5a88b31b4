"""Engine adapters (llama.cpp, vLLM, SGLang) and the registry the agent looks them up in."""

from __future__ import annotations

from agent_worker.engines.base import EngineAdapter
from agent_worker.engines.command import LaunchCommand
from agent_worker.engines.llama_cpp import LlamaCppAdapter
from agent_worker.engines.probe import FoundEngine, ProbeConfig, probe_engines
from agent_worker.engines.sglang import SglangAdapter
from agent_worker.engines.validation import validate_args, validate_env
from agent_worker.engines.vllm import VllmAdapter

ADAPTERS: dict[str, EngineAdapter] = {
    adapter.name: adapter for adapter in (LlamaCppAdapter(), VllmAdapter(), SglangAdapter())
}


class UnknownEngineError(LookupError):
    """An engine name no adapter answers to."""


def get_adapter(name: str) -> EngineAdapter:
    """Return the adapter for an engine name, or say which names there are."""
    try:
        return ADAPTERS[name]
    except KeyError:
        known = ", ".join(sorted(ADAPTERS))
        raise UnknownEngineError(f"no engine called {name!r}; llmgw knows {known}") from None


__all__ = [
    "ADAPTERS",
    "EngineAdapter",
    "FoundEngine",
    "LaunchCommand",
    "LlamaCppAdapter",
    "ProbeConfig",
    "SglangAdapter",
    "UnknownEngineError",
    "VllmAdapter",
    "get_adapter",
    "probe_engines",
    "validate_args",
    "validate_env",
]
