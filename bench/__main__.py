"""``python -m bench [--quick] [--runs N]``: run every case, print a table, write JSON.

Each figure is the median over ``--runs`` runs; each has a baseline measured in the same
run and the ratio to it, because these machines are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import admission, cases, statuspage, tail, timelines, tls, watchpath


def median_rows(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for i, first in enumerate(runs[0]):
        vals = [r[i]["value"] for r in runs]
        bases = [r[i]["baseline"] for r in runs if r[i]["baseline"] is not None]
        value = statistics.median(vals)
        base = statistics.median(bases) if bases else None
        out.append(
            {
                **first,
                "value": value,
                "baseline": base,
                "ratio": (value / base) if base else None,
                "runs": vals,
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--only",
        default="",
        help="comma list: footprint,throughput,scale,identities,tls,reconcile,latency,spans,"
        "ingest,status,tail,admission,incidents,timelines,watchpath",
    )
    args = ap.parse_args()
    runs = 1 if args.quick else args.runs
    q = args.quick
    plan: list[tuple[str, Callable[[], list[dict[str, Any]]]]] = [
        ("footprint", cases.footprint),
        ("throughput", lambda: cases.throughput(1, 20_000 if q else 200_000)),
        ("throughput", lambda: cases.throughput(50, 400 if q else 4_000)),
        ("watchpath", lambda: watchpath.watch_path(10_000 if q else 50_000)),
        ("scale", lambda: cases.scale(50, 200 if q else 2_000, 10 if q else 60)),
        ("identities", lambda: cases.identities(50 if q else 500, 10 if q else 60)),
        ("tls", lambda: tls.tls_idle(50, 200 if q else 2_000, 60)),
        ("reconcile", lambda: cases.reconcile_cpu(10_000 if q else 100_000, 500)),
        ("reconcile", lambda: cases.reconcile_cpu(10_000 if q else 100_000, 100)),
        ("latency", lambda: cases.detection_latency(1_000 if q else 10_000, 15.0)),
        ("spans", lambda: cases.spans(2_000 if q else 20_000)),
        ("ingest", lambda: cases.ingest_overload(200 if q else 2_000)),
        ("status", lambda: statuspage.status_page(2_000 if q else 20_000)),
        ("tail", lambda: tail.tail(1_000 if q else 10_000)),
        ("admission", lambda: admission.admission(50, 2_000 if q else 10_000)),
        ("incidents", lambda: cases.incident_burst(1_000 if q else 10_000)),
        ("timelines", lambda: timelines.timeline_rss(10_000 if q else 100_000)),
        ("timelines", lambda: timelines.pipeline_rate(20_000 if q else 200_000)),
    ]
    only = set(filter(None, args.only.split(",")))
    rows: list[dict[str, Any]] = []
    for name, fn in plan:
        if only and name not in only:
            continue
        t0 = time.monotonic()
        got = median_rows([fn() for _ in range(runs)])
        rows += got
        print(f"[{name}: {time.monotonic() - t0:.0f}s]", flush=True)
        for r in got:
            print(
                f"    {r['name']}: {r['value']:.4g} {r['unit']} (baseline {r['baseline']})",
                flush=True,
            )
        write(rows, runs=runs, quick=q)
    print()
    print(f"{'measurement':<58} {'value':>12} {'unit':<13} {'baseline':>12} {'ratio':>7}  target")
    for r in rows:
        base = "" if r["baseline"] is None else f"{r['baseline']:.4g}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
        print(
            f"{r['name'][:58]:<58} {r['value']:>12.4g} {r['unit']:<13} {base:>12} "
            f"{ratio:>7}  {r['target']}"
        )
    print(f"\nwrote {write(rows, runs=runs, quick=q)}")


def write(rows: list[dict[str, Any]], *, runs: int, quick: bool) -> Path:
    """Results so far (after every case, so a late failure loses nothing)."""
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    meta = {
        "machine": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "runs": runs,
        "quick": quick,
        "time": time.time(),
    }
    path = out / "latest.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return path


if __name__ == "__main__":
    main()
