"""A stand-in for the control plane's end of the agent link, for the agent's tests."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from websockets.asyncio.server import serve

from protocol.signing import linked_hmac, linked_payload


class Canned:
    """A message that serialises to fixed JSON; the link only ever serialises messages."""

    def __init__(self, **fields) -> None:
        self.fields = fields

    def model_dump_json(self) -> str:
        return json.dumps(self.fields)


@dataclass(frozen=True)
class Signer:
    """A certificate and its key, that signs "linked" answers (a control plane's, or not)."""

    cert_pem: bytes
    key_pem: bytes

    def proof(self, payload: bytes) -> dict[str, str]:
        key = serialization.load_pem_private_key(self.key_pem, None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        signature = key.sign(payload, ec.ECDSA(hashes.SHA256()))
        return {"certificate": self.cert_pem.decode(),
                "signature": base64.b64encode(signature).decode()}  # fmt: skip


class FakeControlPlane:
    """A websocket server that links agents (or refuses them) and records messages.

    Its "linked" answers prove it as a real control plane's do: with the node's ``token``,
    or with ``signer``'s key after a certificate challenge; ``prove=False`` sends none.
    """

    def __init__(
        self,
        refuse: str = "",
        drop: bool = False,
        epoch: int = 0,
        *,
        token: str = "token",  # noqa: S107 (the link tests' token)
        command_key: str = "",
        signer: Signer | None = None,
        prove: bool = True,
    ) -> None:
        self.refuse = refuse
        self.drop = drop  # close every link right after accepting it
        self.epoch = epoch  # told in the answer to a register, when set
        self.token = token
        self.command_key = command_key
        self.signer = signer
        self.prove = prove
        self.received: list[dict] = []
        self.links = 0
        self.server = None
        self.port = 0

    async def handler(self, ws) -> None:
        headers = ws.request.headers
        nonce, node_id = headers.get("X-Llmgw-Link-Nonce", ""), headers.get("X-Llmgw-Node", "")
        if headers.get("X-Llmgw-Auth") == "certificate":
            await ws.send(json.dumps({"type": "challenge", "nonce": "0" * 32}))
            self.received.append(json.loads(await ws.recv()))
        first = json.loads(await ws.recv())
        self.received.append(first)
        if self.refuse:
            await ws.send(json.dumps({"type": "refused", "reason": self.refuse}))
            await ws.close(code=4001)
            return
        self.links += 1
        await ws.send(json.dumps(self.answer(nonce, node_id)))
        if self.drop:
            await ws.close()
            return
        async for message in ws:
            self.received.append(json.loads(message))

    def answer(self, nonce: str, node_id: str) -> dict:
        answer: dict = {"type": "linked", "node": node_id}
        if self.command_key:
            answer["command_key"] = self.command_key
        if self.epoch:
            answer["epoch"] = self.epoch
        payload = linked_payload(nonce, node_id, self.command_key, self.epoch)
        if self.prove and self.signer is not None:
            answer["proof"] = self.signer.proof(payload)
        elif self.prove:
            answer["proof"] = {"hmac": linked_hmac(self.token, payload)}
        return answer

    async def start(self, port: int = 0) -> FakeControlPlane:
        self.server = await serve(self.handler, "127.0.0.1", port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"
