"""``python -m nodewarden_doubles.sidenode``: run the side-node process (see `server`)."""

from __future__ import annotations

import sys

from nodewarden_doubles.sidenode.server import main

if __name__ == "__main__":
    sys.exit(main())
