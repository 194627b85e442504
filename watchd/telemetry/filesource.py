"""A JSON-lines file source that follows its file across rotation (like ``tail -F``).

For agents that write transport events to a shared volume instead of POSTing
them. Each line is an envelope or a bare event (whose sender is the
configured one). Rotation (a new inode) and truncation are detected by
polling; a malformed line is counted and logged with its line number and
skipped — a file has no request to reject.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from watchd.kits import logs
from watchd.telemetry.events import EventSink, EventSource
from watchd.telemetry.ingest import IngestError, parse_batch

log = logs.get("watchd.telemetry")

MAX_LINE = 1 << 20


class FileSource:
    def __init__(
        self,
        path: str,
        *,
        source: EventSource,
        sink: EventSink,
        from_start: bool = False,
        poll: float = 0.5,
    ) -> None:
        self.path = Path(path)
        self.source = source
        self.sink = sink
        self.from_start = from_start
        self.poll = poll
        self.lines = 0
        self.bad_lines = 0
        self.rotations = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "lines": self.lines,
            "bad_lines": self.bad_lines,
            "rotations": self.rotations,
        }

    async def run(self) -> None:
        inode: int | None = None
        offset = 0
        buffer = b""
        first = True
        while True:
            try:
                st = self.path.stat()
            except FileNotFoundError:
                await asyncio.sleep(self.poll)
                continue
            if inode != st.st_ino or st.st_size < offset:
                if inode is not None:
                    self.rotations += 1
                    log.info("file_source.rotated", path=str(self.path))
                inode = st.st_ino
                offset = 0 if (not first or self.from_start) else st.st_size
                buffer = b""
            first = False
            if st.st_size > offset:
                chunk = await asyncio.to_thread(self._read, offset, st.st_size - offset)
                offset += len(chunk)
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                if len(buffer) > MAX_LINE:
                    self.bad_lines += 1
                    buffer = b""
                for raw in lines:
                    self._line(raw)
            await asyncio.sleep(self.poll)

    def _read(self, offset: int, size: int) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(offset, os.SEEK_SET)
            return f.read(min(size, 8 << 20))

    def _line(self, raw: bytes) -> None:
        if not raw.strip():
            return
        self.lines += 1
        try:
            batch = parse_batch(
                raw + b"\n",
                content_type="application/x-ndjson",
                query={
                    "service": self.source.service,
                    "instance": self.source.instance,
                    "agent": self.source.agent or "",
                },
            )
        except (IngestError, UnicodeDecodeError) as exc:
            self.bad_lines += 1
            log.warning(
                "file_source.bad_line", path=str(self.path), line=self.lines, error=str(exc)[:300]
            )
            return
        for source, event in batch:
            self.sink.emit(source, event)
