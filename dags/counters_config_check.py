"""Airflow DAG-file guard for the families YAML: defines no DAG.

It fails to import, with one error naming every broken family entry, while
`counter_families.py` still loads the good families.
"""

import sys
from pathlib import Path

# The `counters` package lives in include/, next to this folder, as an Astro project lays it out
# (deployments install requirements.txt only, not the project itself): README "Deploy".
INCLUDE = str(Path(__file__).resolve().parents[1] / "include")
if INCLUDE not in sys.path:
    sys.path.insert(0, INCLUDE)

from counters.airflow.factory import check_config  # noqa: E402

check_config()
