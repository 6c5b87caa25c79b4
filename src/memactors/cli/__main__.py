"""`python -m memactors.cli`."""

import sys

from memactors.cli import main

sys.exit(main())
