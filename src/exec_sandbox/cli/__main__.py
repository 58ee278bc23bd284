"""`python -m exec_sandbox.cli`: the same as the `sbx` command."""

import sys

from .main import main

sys.exit(main())
