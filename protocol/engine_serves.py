"""What each engine serves of the kinds a profile names (``protocol.serving``), and the
flags that turn them on.

One table for both sides: the catalog refuses, when a file is applied, a profile its engine
cannot serve, and the agent's adapters (``agent_worker/engines/``) build the flags and
refuse the same at launch. An engine process serves one *mode*: the kinds one command line
serves together. A profile's kinds are served by the first of its engine's modes that holds
them all; kinds no single mode holds need a profile each (a model may have several).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from protocol.serving import DEFAULT_SERVES, SERVE_KINDS, ServeKind, serve_kind_problems


@dataclass(frozen=True)
class ServeMode:
    """Kinds one engine process serves together, and the flags that make it serve them."""

    kinds: frozenset[ServeKind]
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineServes:
    """One engine's modes, and what it says of the kinds none of them serves."""

    label: str  # the engine as its users know it, in sentences
    modes: tuple[ServeMode, ...]  # the first that holds a profile's kinds serves them
    missing: Mapping[str, str]  # kind no mode serves -> why, with what to do
    apart: str  # why no single process serves the kinds of two modes
    default: tuple[ServeKind, ...] = DEFAULT_SERVES
    # Other spellings of the flags the modes write (-> the flag), and env that sets them:
    # serves: decides these too.
    aliases: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    flags: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        written = {arg for mode in self.modes for arg in mode.flags if arg.startswith("-")}
        object.__setattr__(self, "flags", tuple(sorted(written | set(self.aliases))))


def _missing(label: str, transcription: str = "") -> dict[str, str]:
    """What ``label`` says of the kinds it has no endpoint for."""
    said = {
        "speech": f"{label} has no /v1/audio/speech endpoint (no engine llmgw runs has "
        "one); remove it",
        "images": f"{label} has no /v1/images/generations endpoint (no engine llmgw runs "
        "has one); remove it",
    }
    if transcription:
        said["transcription"] = transcription
    return said


ENGINE_SERVES: dict[str, EngineServes] = {
    # This build's llama-server (arg.cpp, server-context.cpp): --reranking is --embeddings
    # with rank pooling; /v1/audio/transcriptions needs no flag, only a model with audio
    # input (an --mmproj that hears). It still answers chat with --embeddings (embeddings
    # are switched per batch), but its help restricts --embeddings to embedding models and
    # it then takes one output per sequence a step (no speculative decoding): chat and
    # embeddings get a process each.
    "llama.cpp": EngineServes(
        label="llama-server",
        modes=(
            ServeMode(frozenset({"chat", "transcription"})),
            ServeMode(frozenset({"embeddings"}), ("--embeddings",)),
            ServeMode(frozenset({"rerank"}), ("--reranking",)),
        ),
        missing=_missing("llama-server"),
        apart="its --embeddings is for embedding models only (its help: 'restrict to only "
        "support embedding use case'), and --reranking is --embeddings with rank pooling",
        aliases={"--embedding": "--embeddings", "--rerank": "--reranking"},
        env={"LLAMA_ARG_EMBEDDINGS": "--embeddings", "LLAMA_ARG_RERANKING": "--reranking"},
    ),
    # vLLM 0.10.1 and later (its --runner and --convert; 0.13 removed the older --task):
    # a pooling runner converts the model to an embedder or a cross-encoder (its /v1/rerank
    # and /v1/score); transcription needs no flag, a model like Whisper is detected.
    "vllm": EngineServes(
        label="vLLM",
        modes=(
            ServeMode(frozenset({"chat", "transcription"})),
            ServeMode(frozenset({"embeddings"}), ("--runner", "pooling", "--convert", "embed")),
            ServeMode(frozenset({"rerank"}), ("--runner", "pooling", "--convert", "classify")),
        ),
        missing=_missing("vLLM"),
        apart="it runs a model either to generate (chat, transcription) or to pool, and a "
        "pooling model either embeds (--convert embed) or scores pairs (--convert classify)",
        aliases={"--task": "--convert"},
    ),
    # SGLang 0.5: --is-embedding runs embedding models and cross-encoder rerankers (both
    # endpoints from one process); a decoder-only reranker (Qwen3-Reranker) runs without
    # it, beside chat, so serves: [chat, rerank] is that. No audio endpoints.
    "sglang": EngineServes(
        label="SGLang",
        modes=(
            ServeMode(frozenset({"embeddings", "rerank"}), ("--is-embedding",)),
            ServeMode(frozenset({"chat", "rerank"})),
        ),
        missing=_missing(
            "SGLang",
            "SGLang has no /v1/audio/transcriptions endpoint; run the model on vllm or llama.cpp",
        ),
        apart="--is-embedding runs the model as an embedder or cross-encoder and turns its "
        "generation off",
    ),
}


def effective_serves(engine: str, serves: Sequence[str]) -> list[str]:
    """What a profile serves: the kinds it names, else its engine's default (chat)."""
    if serves:
        return _in_order(serves)
    rules = ENGINE_SERVES.get(engine)
    return list(rules.default if rules else DEFAULT_SERVES)


def serve_problems(engine: str, serves: Sequence[str]) -> list[str]:
    """Every reason ``engine`` cannot serve ``serves`` from one process, with the fix."""
    problems = serve_kind_problems(list(serves))
    rules = ENGINE_SERVES.get(engine)
    if problems or rules is None:
        return problems
    kinds = effective_serves(engine, serves)
    problems = [f"serves: {kind}: {rules.missing[kind]}" for kind in kinds if kind in rules.missing]
    if not problems and _mode_of(rules, kinds) is None:
        listed = ", ".join(kinds)
        problems.append(
            f"serves: [{listed}]: {rules.label} cannot serve these from one process: "
            f"{rules.apart}; give each its own profile (a model may have several)"
        )
    return problems


def serve_flags(engine: str, serves: Sequence[str]) -> list[str]:
    """The flags that make ``engine`` serve ``serves``; [] for what it serves by default.

    Assumes ``serve_problems`` found none.
    """
    rules = ENGINE_SERVES.get(engine)
    mode = _mode_of(rules, effective_serves(engine, serves)) if rules else None
    return list(mode.flags) if mode else []


def serve_owned_flags(engine: str) -> dict[str, str]:
    """Flag -> why a profile's args may not set it (``serves:`` decides it), completing
    "args sets --embeddings, which …"."""
    rules = ENGINE_SERVES.get(engine)
    if rules is None:
        return {}
    return {flag: _owned_why(rules, flag) for flag in rules.flags}


def serve_owned_env(engine: str) -> dict[str, str]:
    """Env name -> why a profile's env may not set it, as for ``serve_owned_flags``."""
    rules = ENGINE_SERVES.get(engine)
    if rules is None:
        return {}
    return {name: _owned_why(rules, flag) for name, flag in rules.env.items()}


def serve_arg_problems(
    engine: str, serves: Sequence[str], args: Sequence[object], env: Mapping[str, object]
) -> list[str]:
    """What a profile's args and env say that fights its ``serves:``: the flags and env it
    decides itself (an adapter refuses those as owned flags), and ``serve_setting_problems``."""
    owned = serve_owned_flags(engine)
    problems = [
        f"args sets {flag}, which {owned[flag]}; remove it"
        for flag in dict.fromkeys(_flag(arg) for arg in args if isinstance(arg, str))
        if flag in owned
    ]
    problems += [
        f"env sets {name}, which {why}; remove it"
        for name, why in serve_owned_env(engine).items()
        if name in env
    ]
    return problems + serve_setting_problems(engine, serves, args, env)


def serve_setting_problems(
    engine: str, serves: Sequence[str], args: Sequence[object], env: Mapping[str, object]
) -> list[str]:
    """Settings a profile may make that undo what its kinds need: llama-server's
    --reranking sets rank pooling, which a later --pooling would change, and its
    /v1/embeddings refuses pooling none (only its own /embeddings takes it)."""
    if engine != "llama.cpp":
        return []
    kinds = effective_serves(engine, serves)
    pooling = _pooling(args, env)
    if pooling is None:
        return []
    if "rerank" in kinds and pooling != "rank":
        return [
            f"--pooling {pooling} undoes the rank pooling reranking needs (serves: [rerank] "
            "sets it); remove --pooling"
        ]
    if "embeddings" in kinds and pooling == "none":
        return [
            "--pooling none gives one vector per token, which /v1/embeddings refuses; use "
            "mean, cls or last, or leave --pooling out for the model's own"
        ]
    return []


def _pooling(args: Sequence[object], env: Mapping[str, object]) -> str | None:
    """llama-server's --pooling as the profile sets it (the last flag wins over the env)."""
    found: str | None = None
    strings = [arg for arg in args if isinstance(arg, str)]
    for index, arg in enumerate(strings):
        if arg == "--pooling" and index + 1 < len(strings):
            found = strings[index + 1]
        elif arg.startswith("--pooling="):
            found = arg.split("=", 1)[1]
    if found is None and isinstance(env.get("LLAMA_ARG_POOLING"), str):
        found = str(env["LLAMA_ARG_POOLING"])
    return found


def _owned_why(rules: EngineServes, flag: str) -> str:
    """Why ``flag`` is serves:'s, naming the serves: that asks for what it does."""
    flag = rules.aliases.get(flag, flag)
    written = [mode for mode in rules.modes if flag in mode.flags]
    kinds = [
        kind
        for mode in written or rules.modes
        for kind in _in_order(mode.kinds)
        if kind not in rules.default
    ]
    choices = " or ".join(f"[{kind}]" for kind in dict.fromkeys(kinds))
    return f"llmgw sets from the profile's serves:; set serves: {choices} instead"


def _mode_of(rules: EngineServes | None, kinds: list[str]) -> ServeMode | None:
    if rules is None:
        return None
    return next((mode for mode in rules.modes if set(kinds) <= mode.kinds), None)


def _in_order(kinds: Sequence[str] | frozenset[str]) -> list[str]:
    """Kinds once each, in ``SERVE_KINDS`` order (unknown ones last, as written)."""
    known = [kind for kind in SERVE_KINDS if kind in kinds]
    return known + [kind for kind in dict.fromkeys(kinds) if kind not in SERVE_KINDS]


def _flag(arg: str) -> str:
    return arg.split("=", 1)[0] if arg.startswith("-") else ""


# What switches each engine's prefix cache off, as a profile's args or env would say it;
# prefix routing to such an engine pins requests to a replica for nothing. vLLM
# (--enable-prefix-caching / --no-enable-prefix-caching) and llama.cpp (--cache-prompt /
# --no-cache-prompt, or LLAMA_ARG_CACHE_PROMPT=0) cache by default; SGLang's radix cache
# only has an off switch.
PREFIX_CACHE_SWITCHES: dict[str, tuple[str, str | None]] = {
    "vllm": ("--no-enable-prefix-caching", "--enable-prefix-caching"),
    "sglang": ("--disable-radix-cache", None),
    "llama.cpp": ("--no-cache-prompt", "--cache-prompt"),
}
LLAMA_CACHE_PROMPT_ENV = "LLAMA_ARG_CACHE_PROMPT"
FALSE_WORDS = ("0", "false", "off", "no", "disabled")


def prefix_cache_switched_off(engine: str, args: list[str], env: dict[str, str]) -> str | None:
    """What in ``args`` or ``env`` turns the engine's prefix cache off, as written; None
    when it stays on. Of an on and an off flag the last wins, as in the engines' parsers,
    and a flag wins over llama.cpp's environment variable."""
    if engine not in PREFIX_CACHE_SWITCHES:
        return None
    off, on = PREFIX_CACHE_SWITCHES[engine]
    said: tuple[str, bool] | None = None  # the last on or off flag, and whether it is off
    for arg in args:
        # Python engines' parsers also take --no_enable_prefix_caching.
        flag = arg.split("=", 1)[0].replace("_", "-")
        if flag in (off, on):
            said = (arg, flag == off)
    if said is not None:
        return said[0] if said[1] else None
    value = env.get(LLAMA_CACHE_PROMPT_ENV, "") if engine == "llama.cpp" else ""
    if value.strip().lower() in FALSE_WORDS:
        return f"{LLAMA_CACHE_PROMPT_ENV}={value}"
    return None
