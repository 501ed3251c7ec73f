"""`python -m topics` runs the CLI."""

import sys

from topics.cli import main

sys.exit(main())
