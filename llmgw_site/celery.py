"""The control plane's Celery app: the reconciler's beat tasks on queue ``control``."""

import os

from celery.signals import after_setup_logger

from core.quiet_celery import QuietCelery, quiet_task_chatter

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")

# Quiet, as the agents' app: the reconciler talks to no other worker (leadership is a
# Redis lease), so their gossip would only cost broker traffic.
app = QuietCelery("llmgw_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_default_queue = "control"
app.conf.beat_schedule = {
    "reconcile": {"task": "fleet.reconcile", "schedule": 2.0, "options": {"expires": 2}},
    "liveness": {"task": "fleet.check_liveness", "schedule": 5.0, "options": {"expires": 5}},
    # A Redis restarted without an ACL file has forgotten every node's user: a node waits
    # at most this long for its queue again.
    "broker-users": {
        "task": "fleet.sync_broker_users",
        "schedule": 15.0,
        "options": {"expires": 15},
    },
}
app.autodiscover_tasks(["fleet", "catalog"])
after_setup_logger.connect(quiet_task_chatter)
