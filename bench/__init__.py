"""Benchmarks: each runs as ``python -m bench.NAME`` from the repository root and prints
its figures beside a baseline measured in the same run (bench/README.md lists them).

What several benches share lives in a few modules here, one concept each:
``processes`` (starting, waiting for and stopping what a bench runs), ``database``
(a bench's own database and the Django it reads it with), ``engines`` (the engines and
the static router benches serve through), ``sim`` (the simulated fleet's set-up and
reads) and ``report`` (percentiles, medians, ratios and tables). The rest are benches
and the parts of one bench (``heartbeat_*`` are heartbeats.py's, ``fault_*`` faults.py's).

This package imports nothing on import: daphne and Celery load single modules of it
(``bench.heartbeat_floor``, ``bench.aiohttp_upstream``, ``bench.chatty_worker``).
"""
