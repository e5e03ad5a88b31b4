"""The control plane's wiring: settings, urls, asgi and the Celery app; nothing else."""
