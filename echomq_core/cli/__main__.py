"""``python -m echomq_core.cli``: the same as the ``echomq`` script."""

import sys

from . import main

sys.exit(main())
