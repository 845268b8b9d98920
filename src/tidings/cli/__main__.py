"""``python -m tidings.cli``: the command line."""

import sys

from tidings.cli import app

sys.exit(app())
