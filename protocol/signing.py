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

import base64
import hashlib
import hmac
import json
import os
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


# Secrets sealed for one node (a replica's secret in StartShard): the broker holds commands
# where other consumers could read them (kombu's shared keys, a node with a wrong password,
# a backup of Redis), so a secret travels only sealed. To a node that links by certificate,
# ECIES: an ephemeral ECDH key on the certificate's curve, HKDF-SHA256, AES-256-GCM, so only
# the holder of the node's private key opens it; to one that links by token, AES-256-GCM
# under a key derived from its command key, which it learned over its proven link. The
# shard's id is bound in (AES-GCM's associated data): a sealed secret moved into another
# shard's spec does not open.

SEALED_BY_CERTIFICATE = "ec1"
SEALED_BY_COMMAND_KEY = "key1"
_SEAL_INFO = b"llmgw-sealed-secret"


class SealError(ValueError):
    """A sealed secret this node cannot open, with the reason."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _aes_key(secret_material: bytes, context: str) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    info = _SEAL_INFO + b"\n" + context.encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret_material)


def seal_to_certificate(cert_pem: bytes, secret: str, context: str) -> str:
    """``secret`` sealed so that only the holder of ``cert_pem``'s private key opens it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    public = x509.load_pem_x509_certificate(cert_pem).public_key()
    if not isinstance(public, ec.EllipticCurvePublicKey):
        raise SealError("the node's certificate does not hold an EC key")
    ephemeral = ec.generate_private_key(public.curve)
    key = _aes_key(ephemeral.exchange(ec.ECDH(), public), context)
    nonce = os.urandom(12)
    sealed = AESGCM(key).encrypt(nonce, secret.encode(), context.encode())
    point = ephemeral.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return f"{SEALED_BY_CERTIFICATE}:{_b64(point)}:{_b64(nonce + sealed)}"


def seal_with_command_key(command_key: str, secret: str, context: str) -> str:
    """``secret`` sealed under a key derived from the node's command key."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    key = _aes_key(command_key.encode(), context)
    nonce = os.urandom(12)
    sealed = AESGCM(key).encrypt(nonce, secret.encode(), context.encode())
    return f"{SEALED_BY_COMMAND_KEY}:{_b64(nonce + sealed)}"


def open_sealed(
    sealed: str, context: str, *, private_key: Any = None, command_key: str = ""
) -> str:
    """The secret ``sealed`` holds, opened with the node's private key (an
    ``ec.EllipticCurvePrivateKey``) or its command key, whichever it was sealed for."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    kind, _, rest = sealed.partition(":")
    try:
        if kind == SEALED_BY_CERTIFICATE:
            if private_key is None:
                raise SealError("it was sealed to a certificate, and this agent holds none")
            point, _, body = rest.partition(":")
            public = ec.EllipticCurvePublicKey.from_encoded_point(private_key.curve, _unb64(point))
            key = _aes_key(private_key.exchange(ec.ECDH(), public), context)
        elif kind == SEALED_BY_COMMAND_KEY:
            if not command_key:
                raise SealError("it was sealed under a command key, and this agent has none")
            body, key = rest, _aes_key(command_key.encode(), context)
        else:
            raise SealError(f"{kind!r} is no way of sealing this agent knows")
        data = _unb64(body)
        return AESGCM(key).decrypt(data[:12], data[12:], context.encode()).decode()
    except SealError:
        raise
    except (InvalidTag, ValueError):
        raise SealError("it does not open with this node's key: sealed for another") from None
