#!/usr/bin/env python3
"""The shared fleet generator (shared/bench/gen_fleet.py, imported unchanged) over N days.

The shared scales span 30 minutes to 2 hours at one profile per series and type every 10 s;
a long-range merge (7 days of one namespace) needs days. This adds a scale of its own:
SERIES series, one profile per type every STEP seconds for DAYS days, the small scale's
workloads otherwise, written in the shared layout (profiles/*.parquet, stacktraces.parquet,
queries.json, expected.json, meta.json), so `shared/bench/peers.py run --scale NAME --data
DIR` and `frostdb-bench` load and check it as any scale. Q2 and Q6 then merge the whole span:
one namespace, and everything.

    gen_days.py --days 7 --data target/bench-data            # writes target/bench-data/week
    gen_days.py --days 2 --series 12 --name days2 --data DIR

Needs numpy and pyarrow (shared/bench/requirements-core.txt). FROSTDB_SHARED points at
shared/ (default: ../shared beside the repository).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = Path(os.environ.get("FROSTDB_SHARED", HERE.parents[2] / "shared"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--series", type=int, default=30, help="a multiple of 3 (3 containers per pod)")
    ap.add_argument("--step", type=int, default=60, help="seconds between profiles of a series")
    ap.add_argument("--name", default=None, help="scale name (default: week for 7 days, else daysN)")
    ap.add_argument("--data", required=True)
    a = ap.parse_args()
    if a.series % 3 or a.series <= 0 or a.days <= 0 or a.step <= 0:
        sys.exit("--series must be a positive multiple of 3, --days and --step positive")
    sys.path.insert(0, str(SHARED / "bench"))
    import gen_fleet as gf  # noqa: E402

    name = a.name or ("week" if a.days == 7 else f"days{a.days}")
    gf.STEP_MS = a.step * 1000
    gf.SCALES[name] = dict(gf.SCALES["small"], series=a.series, timestamps=a.days * 86_400 // a.step)
    out = Path(a.data) / name
    meta = gf.generate_parquet(name, out)
    meta["step_ms"] = gf.STEP_MS
    meta["days"] = a.days
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps({k: meta[k] for k in ("scale", "rows", "profiles_per_type", "seconds", "days", "step_ms")}))


if __name__ == "__main__":
    main()
