"""``counterctl``: a thin command line over the library (the DAG calls the same functions).

One module per group of commands; ``main`` assembles them (see its docstring for exit codes).
"""

from .main import cli, main

__all__ = ["cli", "main"]
