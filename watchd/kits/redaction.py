"""The secret registry that logs and answers are scrubbed with.

Every secret watchd reads is registered here (:data:`REGISTRY`) by the code that
reads it; the log pipeline's last processor (:func:`redact_secrets`) and every
place that echoes text from elsewhere (an error body, a receiver's answer, the
status page) scrub known values as a last line of defence.

Knows nothing of where secrets come from: reading a reference is
``watchd.config.secrets``' job.
"""

from __future__ import annotations

import threading
from collections.abc import MutableMapping
from typing import Any


class SecretRegistry:
    """Known secret values, for redaction. Values shorter than 6 chars are not
    registered: scrubbing them would mangle ordinary words in logs."""

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._lock = threading.Lock()

    def add(self, value: str) -> None:
        if len(value) >= 6:
            with self._lock:
                self._values.add(value)
        if "://" in value:
            self._add_url_parts(value)

    def _add_url_parts(self, url: str) -> None:
        """A URL that is a secret (Slack's webhook, a heartbeat ping URL) leaks by its parts
        too: an answer may quote its path or its key segment without the host."""
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        pieces = [parts.path + (f"?{parts.query}" if parts.query else "")]
        pieces += [seg for seg in parts.path.split("/") if len(seg) >= 16]
        pieces += [kv.split("=", 1)[-1] for kv in parts.query.split("&") if len(kv) >= 16]
        with self._lock:
            self._values.update(p for p in pieces if len(p) >= 16)

    def scrub(self, text: str) -> str:
        for value in self._values:
            if value in text:
                text = text.replace(value, "[REDACTED]")
        return text

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str) and any(v in text for v in self._values)


REGISTRY = SecretRegistry()


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return REGISTRY.scrub(value)
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_scrub(v) for v in value)
    return value


def redact_secrets(
    _logger: Any, _name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: every known secret scrubbed from every field."""
    for key, value in list(event_dict.items()):
        event_dict[key] = _scrub(value)
    return event_dict
