"""The reconciler's beat tasks (queue ``control``); thin wrappers over plain functions."""

from __future__ import annotations

from celery import shared_task

from fleet.liveness import check_liveness


@shared_task(name="fleet.check_liveness")
def check_liveness_task() -> dict:
    report = check_liveness()
    return {"unreachable": report.unreachable, "lost": report.lost, "held_back": report.held_back}
