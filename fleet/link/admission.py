"""What an unauthenticated socket at /agent/ may cost before it proves itself.

Anyone who reaches the control plane can open a socket and ask for the certificate
challenge. Each held a consumer and a descriptor for as long as daphne kept it (a day),
and each forged proof costs a certificate check. So a socket that has not proved itself
within ``LINK_PROOF_TIMEOUT`` is closed, and at most ``LINK_PENDING_PER_ADDRESS`` sockets
from one address wait at once in each process; the next is refused, saying why. A real
agent answers in milliseconds, so neither bites a fleet, even one behind a NAT.
"""

from __future__ import annotations

from collections import Counter


class PendingProofs:
    """Sockets still to prove themselves, counted by peer address, in this process."""

    def __init__(self) -> None:
        self._by_address: Counter[str] = Counter()

    def take(self, address: str, limit: int) -> bool:
        """Count one more from ``address``; False (counting nothing) past ``limit``."""
        if self._by_address[address] >= limit:
            return False
        self._by_address[address] += 1
        return True

    def release(self, address: str) -> None:
        self._by_address[address] -= 1
        if self._by_address[address] <= 0:
            del self._by_address[address]

    def waiting(self, address: str) -> int:
        return self._by_address[address]


pending = PendingProofs()


def peer_address(scope: dict) -> str:
    """The socket's peer address (behind a proxy, the proxy's: one budget for all)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"
