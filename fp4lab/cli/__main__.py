"""`python -m fp4lab.cli`: the `fp4lab` command."""

import sys

from fp4lab.cli import main

sys.exit(main())
