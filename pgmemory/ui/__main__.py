"""``python -m pgmemory.ui``: serve the audit page (see :func:`pgmemory.ui.cli.main`)."""

import sys

from pgmemory.ui.cli import main

sys.exit(main())
