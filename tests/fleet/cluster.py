"""A small cluster for tests of the reconciler: a catalog, nodes that register, a pass."""

from __future__ import annotations

from audit.actors import AGENT_LINK
from fleet.actions.reports import register_node
from fleet.reconcile.passes import reconcile
from protocol import messages
from protocol.engines import EngineInstall
from tests.fleet.inventories import inventory


def catalog(replicas=1, gpus=0, memory="1GiB"):
    """One model, gemma, with one llama.cpp profile of ``replicas`` replicas."""
    return f"""
models:
  - name: gemma
    source: /models/gemma.gguf
    profiles:
      - name: cpu
        engine: llama.cpp
        replicas: {replicas}
        gpus_per_rank: {gpus}
        memory: {memory}
"""


def connect(node_id, engines=("llama.cpp",), **fields):
    """Register ``node_id`` as its agent would, with ``engines`` installed."""
    register = messages.Register(
        inventory=inventory(node_id, **fields),
        engines_probed=True,
        engines=[EngineInstall(engine=name, version="b6000") for name in engines],
    )
    return register_node(node_id, register, actor=AGENT_LINK)


def run(django_capture_on_commit_callbacks, **kwargs):
    """One reconcile pass, with what it sends on commit sent."""
    with django_capture_on_commit_callbacks(execute=True):
        return reconcile(**kwargs)
