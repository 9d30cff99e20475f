"""`python -m tools.team up|down|status|copy-store` (what `./dev team` runs): tools/team/cli.py."""

import sys

from tools.team.cli import main

sys.exit(main())
