"""``python -m dlscale`` is the ``dlscale`` command."""

import sys

from dlscale.cli import main

sys.exit(main())
