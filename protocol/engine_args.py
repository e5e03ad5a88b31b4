"""The flags llmgw gives every engine itself, which a profile's args may not set: checked
where the catalog is written and again by the agent before a launch."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

COMMON_OWNED_FLAGS: Mapping[str, str] = {
    "--host": "llmgw chooses",
    "--port": "llmgw chooses",
    "--api-key": "llmgw sets to the replica's own secret, which only the router sends",
}


def common_flag_problems(args: Iterable[object]) -> list[str]:
    """Refuse args that set what llmgw sets on every engine, once per flag."""
    flags = (arg.split("=", 1)[0] for arg in args if isinstance(arg, str) and arg.startswith("-"))
    return [
        f"args sets {flag}, which {COMMON_OWNED_FLAGS[flag]}; remove it"
        for flag in dict.fromkeys(flags)
        if flag in COMMON_OWNED_FLAGS
    ]
