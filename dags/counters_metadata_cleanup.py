"""Airflow DAG `counters_metadata_cleanup`: daily, deletes Airflow metadata past its retention."""

import sys
from pathlib import Path

# The `counters` package lives in include/, next to this folder, as an Astro project lays it out
# (deployments install requirements.txt only, not the project itself): README "Deploy".
INCLUDE = str(Path(__file__).resolve().parents[1] / "include")
if INCLUDE not in sys.path:
    sys.path.insert(0, INCLUDE)

from counters.airflow.factory import metadata_cleanup_dags  # noqa: E402

globals().update(metadata_cleanup_dags())
