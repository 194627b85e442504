"""Every library's log records and warnings leave as the same JSON lines, secrets scrubbed."""

from __future__ import annotations

import io
import json
import logging
import warnings
from collections.abc import Iterator

import pytest
import structlog

from watchd.kits import logs
from watchd.kits.redaction import REGISTRY


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    buf = io.StringIO()
    logs.configure(json=True, stream=buf)
    yield buf
    root = logging.getLogger()
    for h in [h for h in root.handlers if getattr(h, "_watchd", False)]:
        root.removeHandler(h)
    logging.captureWarnings(False)
    structlog.reset_defaults()


def lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_stdlib_loggers_render_as_json(stream: io.StringIO) -> None:
    """OpenTelemetry SDK, aiohttp and asyncio records are JSON with logger and level."""
    logging.getLogger("opentelemetry.sdk._shared_internal").warning("Transient error %s", "X")
    logging.getLogger("aiohttp.server").error("Error handling request")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("asyncio").exception("Task exception was never retrieved")
    got = lines(stream)
    assert [(e["logger"], e["level"], e["event"]) for e in got] == [
        ("opentelemetry.sdk._shared_internal", "warning", "Transient error X"),
        ("aiohttp.server", "error", "Error handling request"),
        ("asyncio", "error", "Task exception was never retrieved"),
    ]
    assert "RuntimeError: boom" in str(got[2]["exception"])


def test_python_warnings_become_json_lines(stream: io.StringIO) -> None:
    """A `warnings.warn` from any library is one JSON line, not stderr text."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        logging.captureWarnings(True)
        warnings.warn("old API", UserWarning, stacklevel=1)
    (event,) = lines(stream)
    assert event["logger"] == "py.warnings" and "UserWarning: old API" in str(event["event"])


def test_library_records_are_scrubbed_of_secrets(stream: io.StringIO) -> None:
    """A secret inside a library's message is redacted like in our own events."""
    REGISTRY.add("library-leaked-secret-42")
    logging.getLogger("aiohttp.client").warning("url had library-leaked-secret-42 in it")
    (event,) = lines(stream)
    assert "library-leaked-secret-42" not in json.dumps(event)


def test_lines_to_the_journal_carry_their_syslog_priority(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When JOURNAL_STREAM names stderr's device:inode (systemd connected it to the
    journal), each line starts with <N> (warning 4, error 3, info 6), so `journalctl -p
    warning` finds them; a stream that is not the journal's gets no prefix."""
    import os
    from pathlib import Path

    path = Path(str(tmp_path)) / "journal"
    with path.open("w") as journal:
        st = os.fstat(journal.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        logs.configure(level="info", json=True, stream=journal)
        log = logs.get("watchd.test")
        log.info("said.info")
        log.warning("said.warning")
        logging.getLogger("aiohttp.test").error("a library's error")
        journal.flush()
    got = path.read_text().splitlines()
    assert [line[:3] for line in got] == ["<6>", "<4>", "<3>"]
    assert json.loads(got[1][3:])["event"] == "said.warning"
    other = io.StringIO()
    try:
        logs.configure(level="info", json=True, stream=other)
        logs.get("watchd.test").warning("plain")
        assert other.getvalue().startswith("{")
    finally:
        root = logging.getLogger()
        for h in [h for h in root.handlers if getattr(h, "_watchd", False)]:
            root.removeHandler(h)
        logging.captureWarnings(False)
        structlog.reset_defaults()
