"""Commands down to a node: Celery tasks on the queue ``node-<id>``.

Each carries an expiry, so a command queued for a node that was away is dropped
rather than obeyed an hour late, and an id the agent obeys once (a captured command put
back on the queue is refused); each is idempotent by shard id on the agent too.
Request/reply commands wait at most REPLY_TIMEOUT for the agent's answer.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import current_app
from celery.exceptions import TimeoutError as CeleryTimeout

from fleet import leadership
from fleet.models import Node, NodeCertificate
from fleet.pki.keys import command_key
from fleet.pki.redaction import replica_secrets, without_secrets
from protocol.commands import (
    AnnounceEpoch,
    CollectWeights,
    ConvergeEngines,
    Drain,
    EngineCallers,
    EngineCheck,
    FetchWeights,
    NodeCommand,
    ReadLogs,
    StartShard,
    StopShard,
    command_task_id,
    node_queue,
)
from protocol.engines import WantedEngine
from protocol.shard import ShardSpec
from protocol.signing import seal_to_certificate, seal_with_command_key, sign

log = logging.getLogger("llmgw.fleet.commands")

START_EXPIRES = 120
STOP_EXPIRES = 600
# A node away longer is told again when it links; an hour-old engine list is no order.
CONVERGE_EXPIRES = 600
# As long as a deposed leader's stop can wait on a queue: it outlives every command it fences.
EPOCH_EXPIRES = STOP_EXPIRES
REPLY_TIMEOUT = 10.0


class AgentDidNotAnswer(Exception):
    """A request/reply command got no answer in time: the agent is too old or unreachable."""


@contextmanager
def one_connection() -> Iterator[Any]:
    """A producer for the commands of a block, passed to each ``send``: one broker
    connection for all of them instead of one taken from the pool each time."""
    with current_app.producer_or_acquire() as producer:
        yield producer


def send(
    node_id: str,
    command: NodeCommand,
    expires: float,
    producer: Any = None,
    key_generation: str | None = None,
):
    """Put a signed, expiring command on the node's queue, under an id of its own (in its
    Celery task id) that the agent obeys once.

    Signed with the key of the node's latest link (``key_generation``, read from its row
    when not given): a node that has not linked since a revocation holds no key it verifies.
    """
    if key_generation is None:
        key_generation = _key_generation(node_id)
    deadline = time.time() + expires
    args = command.args()
    command_id = uuid.uuid4().hex
    signature = sign(command_key(node_id, key_generation), command.task, args, deadline, command_id)
    return current_app.send_task(
        command.task,
        args=args,
        kwargs={"deadline": deadline, "signature": signature, "command_id": command_id},
        # Its node's queue first: the node's broker user may write this result and no other.
        task_id=command_task_id(node_id, command_id),
        queue=node_queue(node_id),
        expires=expires,
        producer=producer,
    )


def _key_generation(node_id: str) -> str:
    found = Node.objects.filter(id=node_id).values_list("key_generation", flat=True).first()
    return found or ""


def send_start_shard(node_id: str, spec: ShardSpec) -> None:
    """Start a shard, its replica's secret sealed for the node: never in clear on the broker."""
    generation = _key_generation(node_id)
    sealed = sealed_for_node(node_id, generation, spec)
    send(node_id, StartShard(spec=sealed), START_EXPIRES, key_generation=generation)


def sealed_for_node(node_id: str, generation: str, spec: ShardSpec) -> ShardSpec:
    """``spec`` with its secret sealed to the certificate the node linked with (its link's
    generation is that certificate's serial), else under the command key of that link."""
    if not spec.api_key:
        return spec
    cert_pem = (
        NodeCertificate.objects.filter(serial=generation)
        .values_list("certificate_pem", flat=True)
        .first()
    )
    if cert_pem:
        sealed = seal_to_certificate(cert_pem.encode(), spec.api_key, spec.shard_id)
    else:
        sealed = seal_with_command_key(
            command_key(node_id, generation), spec.api_key, spec.shard_id
        )
    return spec.model_copy(update={"api_key": "", "sealed_api_key": sealed})


def send_stop_shard(node_id: str, shard_id: str, epoch: int | None = None) -> None:
    """Tell the node to stop a shard, fenced by the leader epoch the sender acts under.

    The reconciler passes its own epoch, so a deposed leader's stops are refused; other
    senders (an operator's action, a register) act under the current lease's.
    """
    if epoch is None:
        lease = leadership.current()
        epoch = lease.epoch if lease is not None else 0
    send(node_id, StopShard(shard_id=shard_id, epoch=epoch), STOP_EXPIRES)


def announce_epoch(epoch: int) -> None:
    """Tell every node the epoch of the leader that just took the lease (lost nodes too:
    one that comes back reads its queue first)."""
    with one_connection() as producer:
        for node_id, generation in Node.objects.values_list("id", "key_generation"):
            send(node_id, AnnounceEpoch(epoch=epoch), EPOCH_EXPIRES, producer, generation)


def send_converge_engines(
    node_id: str,
    engines: list[WantedEngine],
    producer: Any = None,
    key_generation: str | None = None,
) -> None:
    send(node_id, ConvergeEngines(engines=engines), CONVERGE_EXPIRES, producer, key_generation)


def send_engine_callers(
    node_id: str, addresses: list[str], producer: Any = None, key_generation: str | None = None
) -> None:
    """Tell the node who its walls admit on engines' HTTP ports (routers, control planes)."""
    send(node_id, EngineCallers(addresses=addresses), CONVERGE_EXPIRES, producer, key_generation)


def send_drain(
    node_id: str, draining: bool, producer: Any = None, key_generation: str | None = None
) -> None:
    """Tell the agent to take no new shards (or to take them again)."""
    send(node_id, Drain(draining=draining), CONVERGE_EXPIRES, producer, key_generation)


def read_logs(node_id: str, source: str = "agent", lines: int = 200) -> dict:
    """The node's recent log lines for ``source``, and the sources it has, without the
    secret of any replica the node runs (an engine may print its own)."""
    answer = _ask(node_id, ReadLogs(source=source, lines=lines))
    if answer.get("lines"):
        secrets = replica_secrets(node_id=node_id)
        answer = {**answer, "lines": without_secrets(answer["lines"], secrets)}
    return answer


def engine_check(node_id: str, engine: str) -> dict:
    """Ask the node to run ``ENGINE --version``: the one place an engine is run on purpose."""
    return _ask(node_id, EngineCheck(engine=engine))


def collect_weights(node_id: str) -> dict:
    """Have the node delete fetched weights that no catalog model uses any more."""
    from catalog.models import Model

    keep = {source for source, _adapters in Model.objects.values_list("source", "adapters")}
    # A LoRA adapter fetched like the weights is kept like them while its model lists it.
    for adapters in Model.objects.values_list("adapters", flat=True):
        keep.update(adapter["source"] for adapter in adapters or [])
    return _ask(node_id, CollectWeights(keep=sorted(keep)))


def fetch_weights(node_id: str, source: str, sha256: str = "") -> dict:
    """Have the node start fetching ``source`` ahead of need; ``fetching`` or the reason not."""
    return _ask(node_id, FetchWeights(source=source, sha256=sha256))


def _ask(node_id: str, command: NodeCommand) -> dict:
    result = send(node_id, command, REPLY_TIMEOUT)
    try:
        return result.get(timeout=REPLY_TIMEOUT)
    except CeleryTimeout:
        raise AgentDidNotAnswer(
            f"the agent on {node_id} did not answer in {REPLY_TIMEOUT:.0f} s "
            "(too old or unreachable)"
        ) from None
    finally:
        result.forget()
