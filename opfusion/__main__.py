"""``python -m opfusion``: the ``opfusion`` command (see :mod:`opfusion.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
