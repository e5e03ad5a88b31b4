"""`llmgw_ctl` as tests run it: in process, its output returned."""

from __future__ import annotations

from io import StringIO

from django.core.management import call_command


def ctl(*args: str) -> str:
    out = StringIO()
    call_command("llmgw_ctl", *args, stdout=out)
    return out.getvalue()
