"""Engines run with an environment of their own: what they need, never the agent's secrets."""

from __future__ import annotations

import json
import sys

import pytest
from stub_engine import Harness

from agent_worker.engines.base import engine_env
from agent_worker.engines.command import LaunchCommand
from agent_worker.supervision.process import ShardProcess
from tests.support.polling import wait_until

# Writes the environment it was started with to the file named by its first argument.
DUMP_ENVIRONMENT = (
    "import json, os, sys; open(sys.argv[1], 'w').write(json.dumps(dict(os.environ)))"
)

AGENTS_OWN = {
    "LLMGW_NODE_TOKEN": "signs-this-nodes-commands",
    "LLMGW_AGENT_SERVERS": "wss://control.example:8443",
    "DATABASE_URL": "postgresql://llmgw:pw@db/llmgw",
    "REDIS_URL": "redis://:pw@redis:6379/0",
    "SECRET_KEY": "django-secret",
    "CELERY_BROKER_URL": "redis://:pw@redis:6379/1",
    "DJANGO_SETTINGS_MODULE": "llmgw_site.settings",
    "GITHUB_TOKEN": "ghp_not-for-engines",
    "HF_HUB_TOKEN": "a-token-under-an-allowed-prefix",
    "HF_TOKEN": "the-agents-own",
    "PYTHONPATH": "/opt/llmgw",
}
ENGINES_NEED = {
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
    "NCCL_DEBUG": "INFO",
    "CUDA_CACHE_PATH": "/scratch/cuda-cache",
    "HF_HOME": "/scratch/hf",
    "OMP_NUM_THREADS": "4",
    "LLMGW_LABEL_TEAM": "search",  # an operator's label, for finding engines with ps
}


@pytest.mark.process
def test_an_engine_gets_what_it_needs_and_none_of_the_agents_secrets(tmp_path, monkeypatch):
    for name, value in {**AGENTS_OWN, **ENGINES_NEED, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}.items():
        monkeypatch.setenv(name, value)
    profile_env = {"LLAMA_ARG_THREADS": "3", "HF_TOKEN": "the-profiles-own"}
    spec = Harness(tmp_path).spec(gpus=[1], env=profile_env)
    dump = tmp_path / "environment.json"
    argv = (sys.executable, "-c", DUMP_ENVIRONMENT, str(dump))
    command = LaunchCommand(argv=argv, env=engine_env(spec), name="engine")

    process = ShardProcess.launch(command, tmp_path / "engine.log")

    ended = wait_until(process.poll, what="the engine to write its environment and exit")
    assert ended.code == 0, (tmp_path / "engine.log").read_text()
    seen = json.loads(dump.read_text())
    leaked = sorted(name for name in AGENTS_OWN if name in seen and name != "HF_TOKEN")
    assert leaked == []
    own = [name for name in seen if name.startswith(("LLMGW_", "CELERY_", "DJANGO_"))]
    assert [name for name in own if not name.startswith("LLMGW_LABEL_")] == []
    assert seen["HF_TOKEN"] == "the-profiles-own"  # set by the profile on purpose
    assert seen["LLAMA_ARG_THREADS"] == "3"
    assert seen["CUDA_VISIBLE_DEVICES"] == "1"  # the shard's GPU, not the agent's
    assert seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert {name: seen.get(name) for name in ENGINES_NEED} == ENGINES_NEED
    assert seen["PATH"] and seen["HOME"]
