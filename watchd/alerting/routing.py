"""The route tree (Alertmanager semantics).

An alert descends from the root: the first matching child takes it unless
that child says ``continue``, in which case the search goes on to its
siblings; a node whose children all miss takes the alert itself. Unset
options inherit from the parent. Pure and synchronous.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from watchd.config.alerting import RouteConfig
from watchd.kits.matchers import Matcher, all_match, parse_matchers

DEFAULT_GROUP_BY = ("identity", "alertname", "status")
DEFAULT_GROUP_WAIT = 30.0
DEFAULT_GROUP_INTERVAL = 300.0
DEFAULT_REPEAT_INTERVAL = 4 * 3600.0
MAX_KEYS = 4096  # group keys remembered per route


@dataclass(frozen=True)
class Route:
    id: str  # path in the tree, e.g. "0.1": stable across reloads of the same config
    receiver: str
    matchers: tuple[Matcher, ...]
    group_by: tuple[str, ...]
    group_wait: float
    group_interval: float
    repeat_interval: float
    continue_: bool
    children: tuple[Route, ...] = field(default=())
    # group_by values -> group key: a burst of ten thousand alerts shares a few keys, and
    # formatting each one anew was a tenth of the fire pass. Bounded, never compared.
    _keys: dict[tuple[str, ...], str] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def match(self, labels: Mapping[str, str]) -> list[Route]:
        """The routes that take an alert with these labels (at least the root)."""
        if self.matchers and not all_match(self.matchers, labels):
            return []
        if not self.children:
            return [self]
        found: list[Route] = []
        for child in self.children:
            hits = child.match(labels)
            if hits:
                found.extend(hits)
                if not child.continue_:
                    break
        return found or [self]

    def group_key(self, labels: Mapping[str, str]) -> str:
        """Route id plus the group_by label values: one aggregation group per key."""
        if self.group_by == ("...",):
            return self._format(sorted(labels.items()))
        values = tuple([labels.get(k, "") for k in self.group_by])
        key = self._keys.get(values)
        if key is None:
            if len(self._keys) >= MAX_KEYS:
                self._keys.clear()
            key = self._keys[values] = self._format(zip(self.group_by, values, strict=True))
        return key

    def _format(self, parts: Iterable[tuple[str, str]]) -> str:
        inner = ",".join(f"{k}={v!r}" for k, v in parts)
        return f"{self.id}:{{{inner}}}"

    def group_labels(self, labels: Mapping[str, str]) -> dict[str, str]:
        if self.group_by == ("...",):
            return dict(labels)
        return {k: labels.get(k, "") for k in self.group_by}


def build(config: RouteConfig, *, parent: Route | None = None, path: str = "root") -> Route:
    receiver = config.receiver or (parent.receiver if parent else "")
    node = Route(
        id=path,
        receiver=receiver,
        matchers=parse_matchers(config.matchers),
        group_by=tuple(config.group_by)
        if config.group_by is not None
        else (parent.group_by if parent else DEFAULT_GROUP_BY),
        group_wait=_pick(config.group_wait, parent.group_wait if parent else DEFAULT_GROUP_WAIT),
        group_interval=_pick(
            config.group_interval, parent.group_interval if parent else DEFAULT_GROUP_INTERVAL
        ),
        repeat_interval=_pick(
            config.repeat_interval, parent.repeat_interval if parent else DEFAULT_REPEAT_INTERVAL
        ),
        continue_=config.continue_,
    )
    children = tuple(build(c, parent=node, path=f"{path}.{i}") for i, c in enumerate(config.routes))
    fields = {k: v for k, v in node.__dict__.items() if k != "_keys"}
    return Route(**{**fields, "children": children})


def _pick(value: float | None, inherited: float) -> float:
    return inherited if value is None else value


def describe(route: Route, *, indent: int = 0) -> list[str]:
    """The tree with inherited options resolved, one node per line (for check-config)."""
    from watchd.config.fields import format_duration

    matchers = ", ".join(str(m) for m in route.matchers) or "(all alerts)"
    times = "/".join(
        format_duration(t) for t in (route.group_wait, route.group_interval, route.repeat_interval)
    )
    line = (
        f"{'  ' * indent}- {matchers} -> {route.receiver}  group_by={list(route.group_by)} "
        f"wait/interval/repeat={times}{'  continue' if route.continue_ else ''}"
    )
    out = [line]
    for child in route.children:
        out.extend(describe(child, indent=indent + 1))
    return out
