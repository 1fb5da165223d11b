"""Airflow plugin: the "Counter families" pages in the Airflow UI (Browse > Counter families).

The API server mounts the pages' FastAPI app at ``/counters``; the UI shows them in its own
frame through an external view, behind Airflow's login (the app resolves the user from the
UI's session cookie). The code is in ``counters.airflow.ui``; see docs/airflow.md, "The
Counter families pages".

Airflow imports every file of the plugins folder in its other processes too (scheduler, task
processes): this one only builds the app object, which imports FastAPI and Jinja; the
Cassandra driver and Airflow's API modules are imported by the first request.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The `counters` package lives in include/, next to this folder, as an Astro project lays it out
# (deployments install requirements.txt only, not the project itself): README "Deploy".
INCLUDE = str(Path(__file__).resolve().parents[1] / "include")
if INCLUDE not in sys.path:
    sys.path.insert(0, INCLUDE)

from airflow.plugins_manager import AirflowPlugin  # noqa: E402
from counters.airflow.pool import PoolListener  # noqa: E402
from counters.airflow.ui.app import create_app  # noqa: E402

URL_PREFIX = "/counters"


class CounterFamiliesPlugin(AirflowPlugin):
    name = "counter_families"
    # creates the pool `cassandra_compaction` when a scheduler starts and it is missing
    listeners = [PoolListener()]  # noqa: RUF012
    fastapi_apps = [  # noqa: RUF012 (Airflow's plugin interface: class attributes)
        {"app": create_app(URL_PREFIX), "url_prefix": URL_PREFIX, "name": "Counter families"}
    ]
    external_views = [  # noqa: RUF012
        {
            "name": "Counter families",
            "href": URL_PREFIX.lstrip("/") + "/",  # relative: the UI resolves it on its base URL
            "icon": URL_PREFIX.lstrip("/") + "/assets/icon.svg",
            "url_route": "counter-families",
            "destination": "nav",
            "category": "browse",
        }
    ]
