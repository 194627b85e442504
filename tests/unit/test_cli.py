"""The command line: README's command table agrees with the parser; global options anywhere."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from watchd.cli import build_parser
from watchd.commands.scan import ScanResult, exit_code

ROOT = Path(__file__).resolve().parents[2]


def readme_rows() -> list[str]:
    text = (ROOT / "README.md").read_text()
    table = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    return [m.group(1) for m in re.finditer(r"^\| `(watchd [^`]+)` \|", table, flags=re.MULTILINE)]


def subcommands() -> set[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


def test_readme_lists_every_command_and_only_real_ones() -> None:
    """Each README row names a real sub-command, and every sub-command has a row."""
    names = {row.split()[1] for row in readme_rows()}
    assert names == subcommands()


@pytest.mark.parametrize("row", readme_rows())
def test_every_option_in_readme_is_accepted(row: str) -> None:
    """Each option shown in a README row parses for that command."""
    words = row.replace("[", " ").replace("]", " ").split()
    command = words[1]
    argv = [command]
    if command == "test-alert":
        argv.append("console")
    if command == "silence":
        argv.append("list")
    values = {"S": "1", "H:P": "127.0.0.1:1", "NAME": "demo", "A-E": "E", "N": "3"}
    for i, w in enumerate(words):
        if w.startswith("-"):
            argv.append(w)
            nxt = words[i + 1] if i + 1 < len(words) else ""
            if nxt and not nxt.startswith("-"):
                argv.append(values.get(nxt, "x"))
    build_parser().parse_args(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["-c", "F", "--log-level", "debug", "--json", "silence", "list"],
        ["silence", "-c", "F", "--log-level", "debug", "--json", "list"],
        ["silence", "list", "-c", "F", "--log-level", "debug", "--json"],
        ["--log-level", "debug", "silence", "list", "--json", "-c", "F"],
    ],
)
def test_global_options_before_or_after_the_sub_command(argv: list[str]) -> None:
    """-c, --log-level and --json mean the same wherever they stand."""
    args = build_parser().parse_args(argv)
    assert (args.config, args.log_level, args.json) == ("F", "debug", True)


def test_global_option_defaults_survive_sub_commands() -> None:
    """An option given before the command is not reset by the command's own copy."""
    args = build_parser().parse_args(["--log-level", "error", "scan"])
    assert (args.config, args.log_level, args.json) == (None, "error", False)


def test_scan_exit_code_rules() -> None:
    """scan: 1 if anything is stuck even when another identity failed; 2 only if all failed."""
    ok = ScanResult(identity="a", deployment="d")
    stuck = ScanResult(identity="b", deployment="d", stuck=[{"chat_id": "x"}])
    failed = ScanResult(identity="c", deployment="d", error="401")
    assert exit_code([ok]) == 0
    assert exit_code([stuck, failed]) == 1
    assert exit_code([ok, failed]) == 0
    assert exit_code([failed]) == 2


def test_state_dir_check_has_no_side_effects(tmp_path: Path) -> None:
    """check-config's state_dir probe reports a creatable directory without creating it,
    and names a path under a regular file."""
    from watchd.daemon.preflight import check_state_dir

    target = tmp_path / "a" / "b"
    assert check_state_dir(target) is None and not (tmp_path / "a").exists()
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert check_state_dir(blocker / "state") == (
        f"state_dir: cannot create {blocker / 'state'} ({blocker} is not a directory)"
    )
    assert check_state_dir(blocker) == f"state_dir: {blocker} is not a directory"


def test_a_fatal_signal_is_said_on_stderr_not_silent() -> None:
    """A process killed by SIGBUS (an immutable state file under a memory map) prints
    what happened and where, instead of dying without a word."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "watchd", "sim", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # it runs: the simulator says where it listens
        time.sleep(0.2)
        proc.send_signal(signal.SIGBUS)
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGBUS
    assert b"Fatal Python error: Bus error" in err


def test_silence_cli_reads_like_amtool(monkeypatch: pytest.MonkeyPatch) -> None:
    """silence list shows durations as 2h and marks expired ones; add's --author defaults
    to $USER and --duration shows its default; each action's --help has an example and
    the exit codes."""
    import contextlib
    import io

    from watchd.cli import build_parser
    from watchd.commands.silence import listing

    shown = listing(
        [
            {"id": "a1", "matchers": ['team="a"'], "ends_at": 8200.0, "starts_at": 900.0,
             "created_by": "ops", "comment": "maint", "state": "active"},
            {"id": "b2", "matchers": ['x="y"'], "ends_at": 400.0, "starts_at": 100.0,
             "created_by": "me", "comment": "", "state": "expired"},
        ],
        now=1000.0,
    )  # fmt: skip
    assert "in 2h" in shown and "expired 10m ago" in shown and shown.startswith("ID")
    monkeypatch.setenv("USER", "alice")
    args = build_parser().parse_args(["silence", "add", 'a="b"'])
    assert (args.author, args.duration) == ("alice", "2h")
    for action in ("add", "list", "expire"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            build_parser().parse_args(["silence", action, "--help"])
        assert "example:" in out.getvalue() and "exit status: 0" in out.getvalue()
