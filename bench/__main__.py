"""``python -m bench``: see ``bench.run``."""

from .run import main

if __name__ == "__main__":
    raise SystemExit(main())
