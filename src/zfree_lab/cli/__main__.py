"""``python -m zfree.cli``: the ``zfree`` command (tests and the estimate's probes start it so)."""

import sys

from zfree.cli import main

if __name__ == "__main__":
    sys.exit(main())
