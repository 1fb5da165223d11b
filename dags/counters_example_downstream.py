"""Example Airflow DAG `counters_example_after_trades`: scheduled on a family's compact table.

It runs after each run of `compact_trades` that committed something (the table's Asset, see
`counters.airflow.assets`); `COUNTERS_EXAMPLE_FAMILY` picks another family. Without that family
in the families YAML this file defines no DAG.
"""

import sys
from pathlib import Path

# The `counters` package lives in include/, next to this folder, as an Astro project lays it out
# (deployments install requirements.txt only, not the project itself): README "Deploy".
INCLUDE = str(Path(__file__).resolve().parents[1] / "include")
if INCLUDE not in sys.path:
    sys.path.insert(0, INCLUDE)

from counters.airflow.factory import example_dags  # noqa: E402

globals().update(example_dags())
