"""Running ``nft``: replacing llmgw's table, checking that this node can, reading it back.

Every change is one ``nft -f -`` of a whole script (``rules.ruleset``), which the kernel
applies as one transaction: a packet sees the old walls or the new, never a half.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from agent_worker.walls.rules import FAMILY, TABLE, WallError, ruleset

# A service's PATH often lacks the sbin directories, where Debian puts nft.
SEARCHED = ("/usr/sbin", "/sbin", "/usr/local/sbin")
NFT_TIMEOUT = 10.0


def nft_binary() -> str | None:
    found = shutil.which("nft")
    if found:
        return found
    for directory in SEARCHED:
        candidate = os.path.join(directory, "nft")
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def run_script(script: str, check_only: bool = False) -> None:
    """Run ``script`` with ``nft -f -`` (``-c``: only check it); WallError with nft's words."""
    nft = nft_binary()
    if nft is None:
        raise WallError("nft is not installed (Debian and Ubuntu: apt install nftables)")
    argv = [nft, *(["-c"] if check_only else []), "-f", "-"]
    try:
        done = subprocess.run(
            argv, input=script, capture_output=True, text=True, timeout=NFT_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WallError(f"{' '.join(argv)}: {exc}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise WallError(f"nft refused the walls: {' '.join(said[:3])[:400]}")


def unavailable_reason() -> str | None:
    """Why this node cannot keep walls, in words an operator can act on; None when it can.

    Checked with ``nft -c``: the kernel validates a table like the one the walls use (its
    concatenated interval sets too) and the right to change it, and changes nothing.
    """
    probe = ruleset([]) + f"table {FAMILY} {TABLE} {{ set probe {{ type inet_service . " \
        "ipv4_addr; flags interval; }; }\n"  # fmt: skip
    try:
        run_script(probe, check_only=True)
    except WallError as exc:
        words = str(exc)
        if "Operation not permitted" in words:
            return "the agent may not change this node's nftables (it needs root or CAP_NET_ADMIN)"
        if "not installed" in words:
            return words
        return f"this node's nftables cannot hold llmgw's walls: {words}"
    return None


def walled_ports() -> dict[str, list[int]]:
    """The table as it stands: each shard chain and the ports that jump to it ({} when
    there is no table). For tests and an operator's look; the agent never reads it back."""
    nft = nft_binary()
    if nft is None:
        return {}
    done = subprocess.run(
        [nft, "-j", "list", "table", FAMILY, TABLE], capture_output=True, text=True,
        timeout=NFT_TIMEOUT, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return {}
    chains: dict[str, list[int]] = {}
    for item in json.loads(done.stdout).get("nftables", []):
        if "chain" in item and item["chain"]["name"].startswith("shard-"):
            chains.setdefault(item["chain"]["name"], [])
        elem = item.get("map", {}).get("elem", [])
        for port, verdict in elem:
            chains.setdefault(verdict["jump"]["target"], []).append(int(port))
    return chains
