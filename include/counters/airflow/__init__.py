"""Airflow side of the project: the DAG factory, its task bodies, the GX suite and the alerts.

Nothing here connects to anything at import time; ``dags/`` only calls :mod:`.factory`.
"""
