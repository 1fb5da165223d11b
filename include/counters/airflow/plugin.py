"""The Airflow plugin of the installed package, registered by the ``airflow.plugins`` entry
point (pyproject.toml): nothing to copy into a plugins folder.

It mounts the "Counter families" pages (Browse > Counter families): the API server mounts the
pages' FastAPI app at ``/counters``; the UI shows them in its own frame through an external
view, behind Airflow's login (the app resolves the user from the UI's session cookie). See
docs/airflow.md, "The Counter families pages". And it registers two listeners for the start of
a scheduler, DAG processor or triggerer: the pool is created when missing
(:mod:`counters.airflow.pool`) and the heavy imports are preloaded before the process forks
(:mod:`counters.airflow.preload`); and one for the triggerer's start, so that a run ended from
the trigger records its asset event (:mod:`counters.airflow.trigger`).

Airflow loads plugins in its other processes too (scheduler, task processes): this module only
builds the app object, which imports FastAPI and Jinja; the Cassandra driver and Airflow's API
modules are imported by the first request.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from counters.airflow.pool import PoolListener
from counters.airflow.preload import PreloadListener
from counters.airflow.trigger import TriggererListener
from counters.airflow.ui.app import create_app

URL_PREFIX = "/counters"


class CounterFamiliesPlugin(AirflowPlugin):
    name = "counter_families"
    listeners = [PoolListener(), PreloadListener(), TriggererListener()]  # noqa: RUF012
    fastapi_apps = [  # noqa: RUF012
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
