"""The "Counter families" pages of the Airflow UI (the plugin in ``plugins/`` mounts ``app``)."""
