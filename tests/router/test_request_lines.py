"""A router's request lines written in batches: each line as the root logger's handlers
format it, with its own time, in order, in one write a stream."""

from __future__ import annotations

import io
import logging

from router.intake.request_ids import LINE_FORMAT, MESSAGE, BatchedLines


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


def test_a_held_line_is_written_as_the_log_format_would_write_it_and_made_a_record_for_others(
    monkeypatch,
):
    plain = logging.StreamHandler(CountingStream())
    plain.setFormatter(logging.Formatter(LINE_FORMAT))
    other = logging.StreamHandler(CountingStream())
    other.setFormatter(logging.Formatter("%(name)s|%(message)s|%(msecs)03d"))
    monkeypatch.setattr(logging.getLogger(), "handlers", [plain, other])
    batched = BatchedLines()
    created = 1796586226.0457
    line = ("abc123", "/v1/chat/completions", "m", "k", 200, 1.25, 7)
    batched.hold(created, line)
    batched.flush()

    record = logging.LogRecord("router.requests", logging.INFO, __file__, 1, MESSAGE, line, None)
    record.created, record.msecs = created, 45.0
    assert plain.stream.getvalue() == logging.Formatter(LINE_FORMAT).format(record) + "\n"
    assert plain.stream.getvalue().endswith(
        " INFO router.requests: request abc123 /v1/chat/completions model=m key=k status=200 "
        "1.2 ms tokens=7\n"
    )  # fmt: skip
    assert other.stream.getvalue() == (
        "router.requests|request abc123 /v1/chat/completions model=m key=k status=200 1.2 ms "
        "tokens=7|045\n"
    )  # fmt: skip
