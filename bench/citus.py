"""``bench/citus.py`` (the name issue 21 gives it): runs ``bench/store/citus.py``."""

import runpy
from pathlib import Path

if __name__ == "__main__":
    runpy.run_path(str(Path(__file__).resolve().parent / "store" / "citus.py"), run_name="__main__")
