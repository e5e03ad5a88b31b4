"""The pieces the engine supervisor (``agent_worker.supervisor``) is built from.

``statedir`` persists what was launched, ``process`` starts, identifies and signals
process groups, ``logtail`` follows an engine's log file, ``health`` decides readiness,
``adoption`` judges what a previous agent left running.
"""
