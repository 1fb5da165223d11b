"""``python -m counters``: ``counterctl`` where no console script is installed (a deployment that
installs requirements.txt only, e.g. an Astro image: ``PYTHONPATH`` holds ``include/``)."""

from .cli import main

main()
