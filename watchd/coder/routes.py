"""The Coder API routes watchd calls, as templates: the bounded ``path`` label of the
request metrics, so no chat id, workspace id, organization or query ever becomes a label
value. A path no template matches is ``other``, methods outside the usual five are
``other``, and answers are counted by class (429 apart from the other 4xx).

Pure: knows the routes, not who calls them. The client builds its paths from the same
prefixes (:data:`PREFIXES`).
"""

from __future__ import annotations

# The chats API moved from /api/experimental to /api/v2; the client probes which one.
PREFIXES = ("/api/v2", "/api/experimental")
CHAT_ROUTES = (
    ("GET", "/chats"),
    ("GET", "/chats/{chat}"),
    ("PATCH", "/chats/{chat}"),
    ("GET", "/chats/{chat}/cost"),
    ("POST", "/chats/{chat}/interrupt"),
    ("POST", "/chats/{chat}/reconcile-invalid"),
    ("POST", "/chats/{chat}/archive"),
)
ROUTES: tuple[tuple[str, str], ...] = (
    *((method, prefix + route) for prefix in PREFIXES for method, route in CHAT_ROUTES),
    ("GET", "/api/v2/users/me"),
    ("GET", "/api/v2/users/me/organizations"),
    ("GET", "/api/v2/organizations/{organization}/members/{user}/workspace-quota"),
    ("GET", "/api/v2/workspaces/{workspace}"),
)
METHODS = frozenset({"GET", "POST", "PATCH", "PUT", "DELETE"})
# Answer classes; "error": no answer (refused, reset, timed out).
STATUSES = ("2xx", "3xx", "4xx", "429", "5xx", "error")
OTHER = "other"


def _split(template: str) -> tuple[str, ...]:
    return tuple(template.split("/"))


# Templates by segment count, the more literal segments first (``users/me`` before a
# ``users/{user}`` should one be added).
_BY_LENGTH: dict[int, list[tuple[str, ...]]] = {}
for _template in sorted({t for _, t in ROUTES}, key=lambda t: t.count("{")):
    _BY_LENGTH.setdefault(len(_split(_template)), []).append(_split(_template))


def template(path: str) -> str:
    """The template of the route ``path`` (a query is ignored) asks for, or ``other``."""
    parts = path.partition("?")[0].split("/")
    for candidate in _BY_LENGTH.get(len(parts), ()):
        for want, got in zip(candidate, parts, strict=True):
            if want != got and not (want.startswith("{") and got):
                break
        else:
            return "/".join(candidate)
    return OTHER


def method(name: str) -> str:
    return name if name in METHODS else OTHER


def status_class(status: int | None) -> str:
    """``2xx`` … ``5xx``, ``429`` apart, ``error`` for no answer (None)."""
    if status is None:
        return "error"
    if status == 429:
        return "429"
    if 200 <= status < 600:
        return f"{status // 100}xx"
    return OTHER
