"""``watchd silence add|list|expire``: the runtime silence API of a running daemon.

Works where operators are: the daemon is found by ``--url`` (default
``http://`` + the config's ``server.listen``), the admin token comes from
``--token-file``, else ``$WATCHD_ADMIN_TOKEN``, else the config's
``server.admin_token`` reference — and no other secret of the config is read.
Exit 0 on success, 1 on any failure (bad matcher, daemon unreachable or
refusing), 2 only when the config is needed (no ``--url``) and invalid.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import aiohttp

from watchd.commands.configuring import config_path
from watchd.config import secrets
from watchd.config.fields import ConfigError, format_duration, parse_duration
from watchd.config.loading import load_config
from watchd.config.secrets import resolve_admin_token
from watchd.kits.matchers import MatcherError, parse_matchers

TOKEN_ENV = "WATCHD_ADMIN_TOKEN"


def base_url(listen: str) -> str:
    """The URL a local client uses for a ``server.listen`` address (wildcards → loopback)."""
    host, _, port = listen.rpartition(":")
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host in ("::", "[::]"):
        host = "[::1]"
    return f"http://{host}:{port}"


def _fail(message: str) -> int:
    print(f"silence: {message}", file=sys.stderr)
    return 1


def main(args: argparse.Namespace) -> int:
    import asyncio

    if args.action == "add":
        try:
            parse_matchers(args.matchers)
            parse_duration(args.duration)
        except (MatcherError, ValueError) as exc:
            return _fail(str(exc))
    url: str | None = args.url
    token: str | None = None
    if args.token_file:
        try:
            token = secrets.read_secret_file(args.token_file, what="--token-file")
        except secrets.SecretError as exc:
            return _fail(str(exc))
    elif os.environ.get(TOKEN_ENV, "").strip():
        token = secrets.read_secret_env(TOKEN_ENV, what=f"${TOKEN_ENV}")
    if url is None or token is None:
        try:
            config = load_config(config_path(args.config))
        except ConfigError as exc:
            if url is None:
                print("invalid configuration (give --url to do without it):", file=sys.stderr)
                for p in exc.problems:
                    print(f"  {p}", file=sys.stderr)
                return 2
        else:
            if url is None:
                url = base_url(config.server.listen)
            if token is None:
                problems: list[str] = []
                value = resolve_admin_token(config, problems)
                if problems and args.action != "list":
                    return _fail(f"{problems[0]} (or give --token-file / ${TOKEN_ENV})")
                token = value.get_secret_value() if value is not None else None
    return asyncio.run(call(url.rstrip("/"), token, args))


async def call(url: str, token: str | None, args: argparse.Namespace) -> int:
    base = f"{url}/api/v1/silences"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(headers=headers) as session:
        try:
            if args.action == "add":
                body: dict[str, Any] = {
                    "matchers": args.matchers,
                    "duration": args.duration,
                    "comment": args.comment,
                    "created_by": args.author,
                }
                status, data = await _call(session, "POST", base, body)
            elif args.action == "list":
                status, data = await _call(session, "GET", base, None)
            else:
                status, data = await _call(session, "DELETE", f"{base}/{args.id}", None)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return _fail(f"cannot reach the daemon at {url}: {exc or type(exc).__name__}")
        except ValueError:
            return _fail(f"{url} did not answer like watchd (not JSON)")
    if status >= 400:
        detail = data.get("error", data) if isinstance(data, dict) else data
        return _fail(f"the daemon refused (HTTP {status}): {detail}")
    if args.json:
        print(json.dumps(data))
    elif args.action == "list":
        print(listing(data["silences"], now=time.time()))
    elif args.action == "add":
        print(data.get("id", ""))  # as amtool: the id alone, for scripts
    else:
        print(f"expired {args.id}")
    return 0


def listing(silences: list[dict[str, Any]], *, now: float) -> str:
    """Silences as amtool lists them: id, matchers, when it ends (or ended), who, why."""
    if not silences:
        return "no silences"
    rows = [("ID", "MATCHERS", "ENDS", "CREATED BY", "COMMENT")]
    for s in silences:
        left = s["ends_at"] - now
        ends = (
            f"in {format_duration(left)}" if left > 0 else f"expired {format_duration(-left)} ago"
        )
        if s.get("state") == "pending":
            ends = f"starts in {format_duration(s['starts_at'] - now)}, " + ends
        rows.append((s["id"], ", ".join(s["matchers"]), ends, s["created_by"], s["comment"]))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
        for r in rows
    ).rstrip()


async def _call(
    session: aiohttp.ClientSession, method: str, url: str, body: dict[str, Any] | None
) -> tuple[int, Any]:
    async with session.request(
        method, url, json=body, timeout=aiohttp.ClientTimeout(total=10)
    ) as r:
        return r.status, await r.json(content_type=None)
