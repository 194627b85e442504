"""``watchd silence add|list|expire``: the runtime silence API of a running daemon."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import aiohttp

from watchd.config import Config, ResolvedSecrets


async def run(config: Config, secrets: ResolvedSecrets, args: argparse.Namespace) -> int:
    base = f"http://{config.server.listen}/api/v1/silences"
    headers = {}
    if secrets.admin_token is not None:
        headers["Authorization"] = f"Bearer {secrets.admin_token.get_secret_value()}"
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
        except aiohttp.ClientError as exc:
            print(f"cannot reach the daemon at {config.server.listen}: {exc}", file=sys.stderr)
            return 1
    if status >= 400:
        print(f"error (HTTP {status}): {data.get('error', data)}", file=sys.stderr)
        return 1
    if args.action == "list":
        now = time.time()
        for s in data["silences"]:
            left = max(0, s["ends_at"] - now)
            print(
                f"{s['id']}  {s['state']:<8} {', '.join(s['matchers'])}  "
                f"ends in {left / 60:.0f}m  by {s['created_by']}  {s['comment']}"
            )
        if not data["silences"]:
            print("no silences")
    else:
        print(json.dumps(data))
    return 0


async def _call(
    session: aiohttp.ClientSession, method: str, url: str, body: dict[str, Any] | None
) -> tuple[int, Any]:
    async with session.request(
        method, url, json=body, timeout=aiohttp.ClientTimeout(total=10)
    ) as r:
        return r.status, await r.json(content_type=None)
