"""One error type for everything Coder answers, classified retryable or permanent.

The classification is what callers branch on; ``meaning`` says, for people,
what that status means for chats (docs/coder-api.md, "Errors").
"""

from __future__ import annotations

from typing import Any

from watchd.kits.redaction import REGISTRY

RETRYABLE_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})

MEANINGS: dict[int, str] = {
    400: "request rejected (bad parameters, archived chat, child chat, already archived)",
    401: "token invalid, expired or missing",
    403: "token lacks permission (or a browser Origin was sent on the watch socket)",
    404: "chat gone or not visible to this token, or route absent under this API prefix",
    408: "request timed out at the server or a proxy",
    409: "chat state conflict (not interruptible, still active and cannot be archived, or its "
    "execution state is invalid)",
    425: "server asked to retry later (too early)",
    429: "rate limited (per user and endpoint)",
    500: "Coder internal error",
    502: "bad gateway (proxy in front of Coder)",
    503: "service unavailable (chatd disabled, or Coder restarting)",
    504: "gateway timeout (proxy in front of Coder)",
}


class CoderError(Exception):
    """A failed exchange with Coder.

    ``status`` is None when the request never got an HTTP answer (DNS, refused,
    reset, timeout). ``retry_after`` is the server's hint in seconds, if any.
    """

    def __init__(
        self,
        *,
        status: int | None,
        message: str,
        detail: str = "",
        method: str = "",
        path: str = "",
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.message = message
        self.detail = detail
        self.method = method
        self.path = path
        self.retry_after = retry_after
        super().__init__(str(self))

    @property
    def retryable(self) -> bool:
        if self.status is None:
            return True
        # chatd switched off is a deployment setting, not a blip: mutations keep failing.
        if self.status == 503 and self.chatd_disabled:
            return False
        return self.status in RETRYABLE_STATUSES or self.status >= 500

    @property
    def chatd_disabled(self) -> bool:
        return self.status == 503 and "AI Gateway must be enabled" in self.message

    @property
    def classification(self) -> str:
        return "retryable" if self.retryable else "permanent"

    @property
    def meaning(self) -> str:
        if self.status is None:
            return "network failure (no HTTP answer)"
        if self.chatd_disabled:
            return "chatd is disabled on this deployment: reads work, mutations fail"
        return MEANINGS.get(self.status, "unexpected status")

    @property
    def invalid_state(self) -> bool:
        """409 "Chat is in an invalid state." (``writeChatInvalidState``): not "nothing to
        do" — every mutation answers the same until ``reconcile-invalid``."""
        return self.status == 409 and "invalid state" in self.message.lower()

    @property
    def is_auth(self) -> bool:
        return self.status in (401, 403)

    def __str__(self) -> str:
        where = f"{self.method} {self.path}".strip()
        code = f"HTTP {self.status}" if self.status is not None else "network error"
        text = f"{where}: {code}: {self.message}" if where else f"{code}: {self.message}"
        if self.detail:
            text += f" ({self.detail[:300]})"
        return text


class PayloadError(ValueError):
    """A Coder payload that does not have the shape we need; names the field."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


def error_from_body(
    *, status: int, body: Any, method: str, path: str, retry_after: float | None
) -> CoderError:
    """Build the error from Coder's ``{message, detail, validations}`` body, tolerating anything."""
    message = ""
    detail = ""
    if isinstance(body, dict):
        m = body.get("message")
        d = body.get("detail")
        message = m if isinstance(m, str) else ""
        detail = d if isinstance(d, str) else ""
        validations = body.get("validations")
        if isinstance(validations, list) and validations:
            parts = []
            for v in validations[:5]:
                if isinstance(v, dict):
                    parts.append(f"{v.get('field')}: {v.get('detail')}")
            if parts:
                detail = (detail + "; " if detail else "") + "; ".join(parts)
    elif isinstance(body, str):
        message = body.strip()[:300]
    if not message:
        message = MEANINGS.get(status, "unexpected status")
    # A server may echo the request's token in its error text: it stops here, before the
    # message reaches logs, /status, alerts or scan output.
    message, detail = REGISTRY.scrub(message), REGISTRY.scrub(detail)
    return CoderError(
        status=status,
        message=message,
        detail=detail,
        method=method,
        path=path,
        retry_after=retry_after,
    )
