"""``python -m chainoffload.cli`` runs the command line, as ``python -m chainoffload`` does."""

import sys

from . import main

sys.exit(main())
