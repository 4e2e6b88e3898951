"""``python -m pgmemory`` runs the command line."""

import sys

from pgmemory.cli import main

sys.exit(main())
