"""Airflow DAGs: one `compact_<family>` DAG per counter family in the families YAML.

The YAML is `include/counter_families.yaml` (or `$COUNTERS_CONFIG`). The DAGs are built by
`counters.airflow.factory`; a broken family entry is reported by `counters_config_check.py`.
"""

import sys
from pathlib import Path

# The `counters` package lives in include/, next to this folder, as an Astro project lays it out
# (deployments install requirements.txt only, not the project itself): README "Deploy".
INCLUDE = str(Path(__file__).resolve().parents[1] / "include")
if INCLUDE not in sys.path:
    sys.path.insert(0, INCLUDE)

from counters.airflow.factory import family_dags  # noqa: E402

globals().update(family_dags())
