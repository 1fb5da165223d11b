"""The Great Expectations suite of a run's conservation evidence (``checks``) and the store of
its results (``evidence``): a layer of their own, below the engine, so ``counterctl compact``
and the DAG validate a run with the same suite. They import only ``config`` and ``core``; GX,
pandas and Airflow's ``ObjectStoragePath`` are imported inside the functions that use them.
"""
