"""``python -m pgmemory`` runs the command line."""

import sys

from pgmemory.cli import run

sys.exit(run())
