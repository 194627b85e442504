"""What every sub-command does first: find the config, load it, report its problems.

Problems go to stderr one per line, each naming its field path, under a header
that says what they stop; the caller turns them into README's exit codes.
Reading a secret is left to the command: each reads only what it uses.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from watchd.config.fields import ConfigError
from watchd.config.loading import DEFAULT_CONFIG_PATH, load_config
from watchd.config.model import Config, shard_index
from watchd.config.secrets import ResolvedSecrets, resolve_secrets
from watchd.config.telemetry import env_problems


def config_path(arg: str | None) -> str:
    return arg or os.environ.get("WATCHD_CONFIG") or DEFAULT_CONFIG_PATH


def print_problems(problems: Sequence[str], header: str = "invalid configuration:") -> None:
    print(header, file=sys.stderr)
    for p in problems:
        print(f"  {p}", file=sys.stderr)


def load_config_or_report(args: argparse.Namespace) -> Config | None:
    """The command's config, or None after printing every problem."""
    try:
        return load_config(config_path(args.config))
    except ConfigError as exc:
        print_problems(exc.problems)
        return None


def load_or_report(args: argparse.Namespace) -> tuple[Config, ResolvedSecrets] | None:
    """The config and every secret (what ``run`` needs), or None after printing problems."""
    config = load_config_or_report(args)
    if config is None:
        return None
    try:
        return config, resolve_secrets(config)
    except ConfigError as exc:
        print_problems(exc.problems)
        return None


def preflight(config: Config) -> list[str]:
    """What ``run`` would die on before doing anything: state_dir, the listen address,
    this replica's number."""
    from watchd.daemon import preflight

    problems = []
    state = preflight.check_state_dir(preflight.effective_state_dir(config.state_dir))
    if state:
        problems.append(state)
    listen = preflight.check_listen(config.server.listen)
    if listen:
        problems.append(listen)
    try:
        shard_index(config)
    except ConfigError as exc:
        problems.extend(exc.problems)
    problems.extend(env_problems(dict(os.environ)))
    return problems
