"""The suite's own guard: a test that leaks a task fails (proved by running one)."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


def test_a_test_that_leaks_a_task_fails(pytester: pytest.Pytester) -> None:
    """The autouse fixture fails a test that leaves a task running, and passes one that
    cleans up after itself."""
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    pytester.makepyfile(
        test_leaky="""
import asyncio


async def test_leaks() -> None:
    asyncio.get_running_loop().create_task(asyncio.sleep(3600), name="forgotten")


async def test_tidy() -> None:
    task = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
    task.cancel()
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.re_match_lines([r".*leaked tasks: \['forgotten'\].*"])
