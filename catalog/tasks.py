"""The catalog's Celery task (queue ``control``): reading a model's file, thinly."""

from __future__ import annotations

from celery import shared_task

from catalog.actions.shapes import MODEL_FILE_READER, READ_MODEL_FILE_TASK, record_model_shape
from catalog.fit.model_files import shape_facts


@shared_task(name=READ_MODEL_FILE_TASK)
def read_model_file_task(model_id: int, source: str) -> str:
    """Read the header of a model's URL or hub repository and keep its shape on the row."""
    facts = shape_facts(source)
    record_model_shape(model_id, source, facts, actor=MODEL_FILE_READER)
    return "read" if "shape" in facts else facts["unreadable"]
