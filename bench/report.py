"""Render bench/results/latest.json as the Markdown table used in docs/PERFORMANCE.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    path = (
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else Path(__file__).parent / "results" / "latest.json"
    )
    data = json.loads(path.read_text())
    meta = data["meta"]
    print(
        f"Machine: {meta['machine']}, Python {meta['python']}, {meta['cpus']} CPUs; "
        f"median of {meta['runs']} run(s).\n"
    )
    print("| measurement | value | baseline (same run) | ratio | target |")
    print("| --- | ---: | --- | ---: | --- |")
    for r in data["rows"]:
        base = "" if r["baseline"] is None else f"{r['baseline']:.4g} ({r['baseline_name']})"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
        runs = ", ".join(f"{v:.4g}" for v in r.get("runs", []))
        print(
            f"| {r['name']} | {r['value']:.4g} {r['unit']} <br><sub>runs: {runs}</sub> | "
            f"{base} | {ratio} | {r['target']} |"
        )


if __name__ == "__main__":
    main()
