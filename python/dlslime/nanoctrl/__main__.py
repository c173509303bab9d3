"""``python -m dlslime.nanoctrl [server|start|stop|status] [options]``."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
