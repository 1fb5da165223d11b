"""Airflow side of the project: the DAG factory, its task bodies and the alerts (the GX
suite is ``counters.gx``).

Nothing here connects to anything at import time; ``dags/`` only calls :mod:`.factory`.
"""
