"""DAG parse time of the project's dags folder for a families file of 1, 10, 100 families.

Each size runs in a fresh interpreter (``COUNTERS_CONFIG`` pointing at a generated YAML, a
throw-away ``AIRFLOW_HOME``) that imports Airflow, then fills a ``DagBag`` from the folder: the
reported parse time is the ``DagBag`` fill alone (what the DAG processor pays per parse, Airflow
already imported), with the Airflow import reported beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DAGS_FOLDER = PROJECT_ROOT / "dags"

_PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
from airflow.dag_processing.dagbag import DagBag
t1 = time.perf_counter()
c1 = time.process_time()
bag = DagBag(dag_folder=sys.argv[1])
t2 = time.perf_counter()
c2 = time.process_time()
warm = []
for _ in range(3):
    start = time.perf_counter()
    DagBag(dag_folder=sys.argv[1])
    warm.append(time.perf_counter() - start)
stats = [
    {"file": str(s.file), "duration_s": getattr(s.duration, "total_seconds", lambda: s.duration)(),
     "dags": s.dag_num}
    for s in getattr(bag, "dagbag_stats", [])
]
print(json.dumps({
    "import_airflow_s": t1 - t0,
    "parse_s": t2 - t1,
    "parse_cpu_s": c2 - c1,
    "warm_reparse_s": sorted(warm)[1],
    "dags": len(bag.dags),
    "import_errors": {str(k): str(v)[-800:] for k, v in bag.import_errors.items()},
    "files": stats,
}))
"""


def families_yaml(count: int, keyspace: str = "counters_parse") -> dict[str, Any]:
    """``count`` increments families shaped like the demo ones (nothing is connected to)."""
    return {
        "families": [
            {
                "name": f"parse_f{i:03d}",
                "description": f"generated family {i} for the parse-time benchmark",
                "kind": "increments",
                "keyspace": keyspace,
                "raw_table": f"raw_{i:03d}",
                "compact_table": f"compact_{i:03d}",
                "lag": "1m",
                "schedule": "* * * * *",
                "shards": 4,
                "tags": ["bench"],
            }
            for i in range(count)
        ]
    }


def measure(
    sizes: list[int], dags_folder: Path = DAGS_FOLDER, repeats: int = 3, timeout: float = 300
) -> dict:
    """Per size, ``repeats`` fresh interpreters; ``parse_s`` is the median cold parse (the
    project's modules imported by the parse, as in a DAG-processor child), ``parse_runs_s`` all
    of them, ``warm_reparse_s`` the median parse with everything already imported."""
    if not dags_folder.is_dir() or not any(dags_folder.glob("*.py")):
        return {
            "status": "dags folder not present",
            "path": str(dags_folder),
            "sizes": {str(n): None for n in sizes},
        }
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-dags-") as tmp:
        for n in sizes:
            config = Path(tmp) / f"families_{n}.yaml"
            config.write_text(yaml.safe_dump(families_yaml(n), sort_keys=False))
            home = Path(tmp) / f"airflow_{n}"
            home.mkdir()
            env = {
                **os.environ,
                "COUNTERS_CONFIG": str(config),
                "AIRFLOW_HOME": str(home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "PYTHONWARNINGS": "ignore",
            }
            runs = []
            error = None
            for _ in range(repeats):
                proc = subprocess.run(
                    [sys.executable, "-c", _PROBE, str(dags_folder)],
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=timeout,
                    cwd=str(PROJECT_ROOT),
                )
                out = proc.stdout.splitlines()
                line = next((x for x in reversed(out) if x.startswith("{")), None)
                if proc.returncode != 0 or line is None:
                    error = f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}"
                    break
                runs.append(json.loads(line))
            if error is not None:
                results[str(n)] = {"error": error}
                continue
            runs.sort(key=lambda r: r["parse_s"])
            data = runs[len(runs) // 2]
            data["parse_runs_s"] = [round(r["parse_s"], 3) for r in runs]
            data["parse_cpu_runs_s"] = sorted(round(r["parse_cpu_s"], 3) for r in runs)
            data["families"] = n
            results[str(n)] = data
    return {"status": "measured", "path": str(dags_folder), "sizes": results}
