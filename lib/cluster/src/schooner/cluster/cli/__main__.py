"""`python -m schooner.cluster.cli ...` is the `schooner` command."""

import sys

from . import main

sys.exit(main())
