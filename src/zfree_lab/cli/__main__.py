"""``python -m zfree_lab.cli``: the ``zfree`` command (tests and the estimate's probes start it so)."""

import sys

from zfree_lab.cli import main

if __name__ == "__main__":
    sys.exit(main())
