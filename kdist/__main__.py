"""`python -m kdist`: the `kdist` command."""

import sys

from kdist.cli.main import main

sys.exit(main())
