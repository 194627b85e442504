"""Headless Chromium for the pages a person reads: the DOM as rendered, and a screenshot
kept in ``test-artifacts/`` (the CDP driver in ``cdp.py`` is for pages that are clicked)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def chromium_args(tmp_path: Path) -> list[str]:
    chromium = shutil.which("chromium")
    assert chromium, "run tests/setup/system-deps (make test does)"
    return [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chrome'}",
    ]


async def dom(tmp_path: Path, url: str) -> str:
    """The page at ``url`` as Chromium rendered it."""
    done = await asyncio.to_thread(
        subprocess.run,
        [*chromium_args(tmp_path), "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout


async def screenshot(tmp_path: Path, url: str, name: str, *, size: str = "1280,1000") -> Path:
    """A screenshot of ``url`` at ``size`` saved as ``test-artifacts/NAME``; asserts that
    Chromium drew something."""
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / name
    shot.unlink(missing_ok=True)
    await asyncio.to_thread(
        subprocess.run,
        [*chromium_args(tmp_path), f"--screenshot={shot}", f"--window-size={size}", url],
        capture_output=True,
        timeout=60,
    )
    assert shot.exists() and shot.stat().st_size > 5000
    return shot
