"""``python -m dlscale`` is the ``dlscale`` command."""

import sys

from .cli import main

sys.exit(main())
