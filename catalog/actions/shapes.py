"""Learning what a model's file says of the memory it needs (``Model.shape``): a local
file at once, a URL or hub id by a task (``catalog.tasks``) once the verb has committed."""

from __future__ import annotations

from functools import partial
from typing import Any

from celery import current_app
from django.db import transaction
from kombu.exceptions import OperationalError

from audit.actors import Actor, SystemActor
from audit.events import record_event
from audit.models import EventKind
from catalog.fit.model_files import is_remote, shape_facts
from catalog.models import Model

# Reads a model's file for its shape, in a task (catalog/tasks.py) or at apply.
MODEL_FILE_READER = SystemActor("model file reader")
READ_MODEL_FILE_TASK = "catalog.read_model_file"


def learn_model_shape(model: Model, *, actor: Actor) -> None:
    """Find out what the model's file says about the memory it needs (``Model.shape``).

    A local file is read now: its header takes milliseconds, and may have been replaced in
    place, so it is read at every apply. A URL or hub id is read by a task once this
    transaction commits (a download never holds up a request), and only until it is known.
    """
    source = model.source
    if not is_remote(source):
        record_model_shape(model.id, source, shape_facts(source), actor=actor)
        return
    if model.shape() is not None or model.shape_note("reading"):
        return
    reading = {"source": source, "reading": f"its header at {source} is being read"}
    Model.objects.filter(id=model.id).update(file_shape=reading)
    model.file_shape = reading
    transaction.on_commit(partial(_ask_to_read, model.id, source))


def _ask_to_read(model_id: int, source: str) -> None:
    try:
        current_app.send_task(READ_MODEL_FILE_TASK, args=[model_id, source], queue="control")
    except OperationalError as err:
        # No broker: say so instead of waiting for a read nobody will do; apply retries.
        facts = {"source": source, "unreadable": f"no worker could be asked to read it: {err}"}
        record_model_shape(model_id, source, facts, actor=MODEL_FILE_READER)


def record_model_shape(model_id: int, source: str, facts: dict[str, Any], *, actor: Actor) -> bool:
    """Keep what was read of a model's file (``shape_facts``), unless its source changed
    meanwhile; record an Event when the estimate appears, or a download could not make it."""
    with transaction.atomic():
        model = Model.objects.select_for_update().filter(id=model_id, source=source).first()
        if model is None or model.file_shape == facts:
            return False
        Model.objects.filter(id=model.id).update(file_shape=facts)
        model.file_shape = facts
        shape = model.shape()
        if shape is not None:
            reason = f"read its file: {shape.describe()}"
        elif model.shape_note("unreadable") and is_remote(source):
            # A local path unreadable here is the rule (the nodes hold the files), not news.
            reason = f"cannot estimate its memory: {model.shape_note('unreadable')}"
        else:
            return True
        record_event(EventKind.CATALOG, model.name, reason, actor=actor)
    return True
