"""Verbs on LoRA adapters by hand: load one on a ready replica, or unload it, where its
engine does that while it runs (vLLM's ``/v1/load_lora_adapter`` and ``/unload``), each
recorded as an Event on the replica. llama.cpp loads adapters only at its start, so there
the answer is the restart that would.

Routers load adapters on demand themselves (router/forward/loras.py); one loaded by hand is
taken by them as loaded ("already loaded"), and one unloaded by hand that a router loaded
is loaded again by the next request that needs it.
"""

from __future__ import annotations

from audit.actors import Actor
from audit.events import record_event
from audit.models import EventKind
from catalog.models import Model
from core.http import outbound_client
from fleet.models import Replica, ReplicaState
from fleet.routing_table import endpoint_url_of
from protocol.shard import ADAPTER_SEPARATOR, adapter_id, loras_of

ENGINE_TIMEOUT = 60.0  # seconds: loading reads the adapter's weights


class AdapterRefused(Exception):
    """A load or unload that cannot be done as asked; ``str()`` names the thing and the fix."""


def load_adapter(adapter: str, replica_id: str, *, actor: Actor) -> str:
    """Load ``adapter`` (``<model>:<adapter>``) on the ready replica ``replica_id``; say what
    its engine answered."""
    return _engine_call(adapter, replica_id, "load", actor)


def unload_adapter(adapter: str, replica_id: str, *, actor: Actor) -> str:
    """Unload ``adapter`` from the ready replica ``replica_id``; say what its engine answered."""
    return _engine_call(adapter, replica_id, "unload", actor)


def _engine_call(name: str, replica_id: str, verb: str, actor: Actor) -> str:
    model_name, _, adapter_name = name.rpartition(ADAPTER_SEPARATOR)
    model = Model.objects.filter(name=model_name).first()
    adapter = next((a for a in (model.adapters if model else []) if a["name"] == adapter_name),
                   None)  # fmt: skip
    if model is None or adapter is None:
        known = [i for m in Model.objects.all() for i in m.adapter_ids()]
        raise AdapterRefused(f"no adapter is named {name!r}; known: {', '.join(known) or 'none'}")
    ready = Replica.objects.filter(model_name=model.name, state=ReplicaState.READY)
    by_id = {"id": replica_id} if len(replica_id) == 36 else {"id__startswith": replica_id}
    replica = ready.filter(**by_id).select_related("profile").first()
    if replica is None:
        raise AdapterRefused(f"no ready replica {replica_id} of {model.name}; llmgw_ctl "
                             f"adapters lists where {name} can be loaded")  # fmt: skip
    if not loras_of(replica.engine).at_runtime or not (
        replica.profile and replica.profile.max_loras
    ):
        raise AdapterRefused(
            f"replica {str(replica.id)[:8]} runs {replica.engine or 'an unknown engine'}, which "
            f"loads adapters only at its start (or has max_loras: 0); {name} is loaded there "
            "once it is restarted with the adapter in its model's adapters:"
        )
    url = endpoint_url_of(replica)
    if url is None:
        raise AdapterRefused(f"replica {str(replica.id)[:8]} has no address for rank 0 yet")
    body = {"lora_name": adapter_id(model.name, adapter_name)}
    if verb == "load":
        body["lora_path"] = adapter["source"]
    headers = {"Authorization": f"Bearer {replica.secret}"} if replica.secret else {}
    with outbound_client(url, ENGINE_TIMEOUT, headers) as client:
        answer = client.post(f"/v1/{verb}_lora_adapter", json=body)
    said = f"{answer.status_code} {answer.text.strip()[:300]}"
    if answer.status_code >= 300:
        raise AdapterRefused(f"the engine of replica {str(replica.id)[:8]} refused to {verb} "
                             f"{name}: {said}")  # fmt: skip
    record_event(EventKind.REPLICA, str(replica.id), f"adapter {name} {verb}ed by hand",
                 actor=actor)  # fmt: skip
    return said
