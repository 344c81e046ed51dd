"""``python -m dilcompile``: the same as the ``dilcompile`` command."""

import sys

from .cli import main

sys.exit(main())
