"""Commands to a node carry a signature only that node and the control plane can make.

The key is the node's command key, which the control plane derives from its own fleet key
and the certificate the node linked with, and tells the node over that proven link; so
anything that can write to the broker but does not hold the key cannot make a node start,
stop or run anything, a command signed for one node is refused by another, and one signed
for a revoked certificate is refused by the node's next. The signed text
covers the task name, its arguments, a deadline and the command's own id, so a captured
command cannot be replayed with other arguments or obeyed late, and the agent, which
obeys each id once until its deadline, does not obey it twice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any


class BadSignature(Exception):
    """A command this node must not obey, with the reason."""


class ArrivedLate(BadSignature):
    """A command that arrived after its deadline: obeyed it would be an order out of date."""


def _message(task: str, args: list[Any], deadline: float, command_id: str) -> bytes:
    return json.dumps(
        [task, args, round(deadline, 3), command_id], sort_keys=True, separators=(",", ":")
    ).encode()


def sign(token: str, task: str, args: list[Any], deadline: float, command_id: str) -> str:
    message = _message(task, args, deadline, command_id)
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def refuse_at_sight(
    task: str, deadline: float, signature: str, command_id: str, now: float | None = None
) -> None:
    """Raise BadSignature for what no key is needed to refuse: an unsigned command, one
    without an id, or one past its deadline (checked again, signed, by ``verify``)."""
    if not signature:
        raise BadSignature(f"{task} arrived unsigned")
    if not command_id:
        raise BadSignature(f"{task} carries no command id, so it could be obeyed twice")
    if (now if now is not None else time.time()) > deadline:
        raise ArrivedLate(f"{task} arrived after its deadline")


def verify(
    token: str,
    task: str,
    args: list[Any],
    deadline: float,
    signature: str,
    command_id: str,
    now: float | None = None,
) -> None:
    """Raise BadSignature unless the command was signed for this token and is still due."""
    if not token:
        raise BadSignature("this agent has no token, so it cannot check who sent the command")
    refuse_at_sight(task, deadline, signature, command_id, now)
    expected = sign(token, task, args, deadline, command_id)
    if not hmac.compare_digest(expected, signature):
        raise BadSignature(f"{task} was not signed for this node")


def proof_payload(nonce: str, node_id: str) -> bytes:
    """What an agent signs with its node certificate's key to prove a link is its own; the
    control plane's fresh nonce makes every proof good for one link only."""
    return f"llmgw-link-proof\n{nonce}\n{node_id}".encode()


def linked_payload(nonce: str, node_id: str, command_key: str, epoch: int) -> bytes:
    """What the control plane signs in its "linked" answer: the agent's own nonce for this
    link, so an answer is good for that link only, and everything the agent takes from it."""
    return f"llmgw-linked\n{nonce}\n{node_id}\n{command_key}\n{epoch}".encode()


def linked_hmac(token: str, payload: bytes) -> str:
    """The "linked" answer's proof to an agent that links by token: only the control plane
    that issued the token can make it."""
    return hmac.new(token.encode(), payload, hashlib.sha256).hexdigest()
