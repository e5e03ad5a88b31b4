"""A router's request lines written in batches: each line as the root logger's handlers
format it, with its own time, in order, in one write a stream."""

from __future__ import annotations

import io
import logging

from router.intake.request_ids import BatchedLines


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_held_lines_reach_each_root_handler_formatted_in_one_write(monkeypatch):
    stream = CountingStream()
    console = logging.StreamHandler(stream)
    console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    warnings_only = logging.StreamHandler(CountingStream())
    warnings_only.setLevel(logging.WARNING)
    monkeypatch.setattr(logging.getLogger(), "handlers", [console, warnings_only])
    batched = BatchedLines()
    for n in range(3):
        batched.handle(logging.LogRecord("router.requests", logging.INFO, __file__, 1,
                                         "request %d", (n,), None))  # fmt: skip
    assert stream.getvalue() == ""  # held until flushed

    batched.flush()
    batched.flush()  # nothing more held: nothing written

    assert stream.getvalue().splitlines() == [
        "INFO router.requests: request 0", "INFO router.requests: request 1",
        "INFO router.requests: request 2",
    ]  # fmt: skip
    assert stream.writes == 1
    assert warnings_only.stream.getvalue() == ""
