import sys

from hpctl.cli import main

sys.exit(main())
