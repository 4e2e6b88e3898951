"""``bench/turn_ab.py`` (the name issue 22 gives it): runs ``bench/serve/turn_ab.py``."""

import runpy
from pathlib import Path

if __name__ == "__main__":
    runpy.run_path(
        str(Path(__file__).resolve().parent / "serve" / "turn_ab.py"), run_name="__main__"
    )
