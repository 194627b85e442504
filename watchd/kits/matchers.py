"""Alertmanager's matcher syntax: ``name="value"``, ``!=``, ``=~``, ``!~``.

Exactly Alertmanager's grammar, nothing looser: a label name, one of the four
operators, then a double-quoted value (escapes ``\\"``, ``\\\\``, ``\\n``) or an
unquoted one made of characters that are not whitespace, quotes, ``{}``, ``,``,
``=``, ``!``, ``~`` or backslash. So a typo such as ``severity==critical`` is an
error naming the matcher, never a matcher for the value ``=critical``.
Regex matchers are anchored, as in Alertmanager. Pure and synchronous.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_MATCHER = re.compile(
    r"^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"
    r'(?:"((?:[^"\\]|\\["\\n])*)"|([^\s"\'{}=!~,\\]*))\s*$'
)
_ESCAPE = re.compile(r"\\([\"\\n])")


class MatcherError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Matcher:
    name: str
    op: str
    value: str
    regex: re.Pattern[str] | None = None

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        assert self.regex is not None
        hit = self.regex.fullmatch(actual) is not None
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.name}{self.op}"{escaped}"'


def parse_matcher(text: str) -> Matcher:
    m = _MATCHER.match(text) if isinstance(text, str) else None
    if m is None:
        raise MatcherError(
            f'bad matcher {text!r}: expected name="value", name!="value", '
            'name=~"regex" or name!~"regex"'
        )
    name, op, quoted, bare = m.groups()
    value = bare
    if quoted is not None:
        value = _ESCAPE.sub(lambda e: "\n" if e.group(1) == "n" else e.group(1), quoted)
    regex = None
    if op in ("=~", "!~"):
        try:
            regex = re.compile(value)
        except re.error as exc:
            raise MatcherError(f"bad regex in matcher {text!r}: {exc}") from None
    return Matcher(name=name, op=op, value=value, regex=regex)


def parse_matchers(texts: Sequence[str]) -> tuple[Matcher, ...]:
    return tuple(parse_matcher(t) for t in texts)


def all_match(matchers: Sequence[Matcher], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)
