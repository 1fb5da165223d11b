"""A CeleryExecutor on one machine without a broker server: kombu's file-system transport.

Point Airflow at it with ``AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS=
counters.airflow.celery_local.CELERY_CONFIG`` and name a folder in ``COUNTERS_CELERY_DIR``
(shared by the scheduler, which publishes the task messages, and every ``airflow celery
worker``, which consumes them). Messages are files in ``<dir>/queue``, task states files in
``<dir>/results`` (celery's ``file://`` result backend, read in bulk by the executor). The rest
is the Celery provider's ``DEFAULT_CELERY_CONFIG`` (queues, acks, concurrency from
``[celery]``). For a test or a single host only: a real deployment uses Redis or RabbitMQ.

The module is imported only by processes that use Celery (``[celery] celery_config_options``);
it creates its folders at import, so every process finds them. In ``airflow celery worker``
(no Airflow job, so no listener's ``on_starting``) it runs the preload
(:func:`counters.airflow.preload.preload_for_process`) in the worker's main process, which forks
the pool processes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

from counters.airflow.preload import preload_for_process

DIR_ENV = "COUNTERS_CELERY_DIR"


def filesystem_config(base: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Pure: ``base`` with the broker and the result backend in ``folder``."""
    queue = folder / "queue"
    return {
        **base,
        "broker_url": "filesystem://",
        "broker_transport_options": {
            # one folder in both directions: producers and consumers share it
            "data_folder_in": str(queue),
            "data_folder_out": str(queue),
            "control_folder": str(folder / "control"),
            "store_processed": False,
        },
        "result_backend": f"file://{folder / 'results'}",
    }


def _folder() -> Path:
    value = os.environ.get(DIR_ENV)
    if not value:
        raise RuntimeError(
            f"{DIR_ENV} is not set: counters.airflow.celery_local keeps the Celery broker's "
            "messages and the task results in files under that folder (the same one for the "
            "scheduler and every worker)"
        )
    folder = Path(value).resolve()
    for sub in ("queue", "control", "results"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    return folder


CELERY_CONFIG = filesystem_config(DEFAULT_CELERY_CONFIG, _folder())

preload_for_process()
