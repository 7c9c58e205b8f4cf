import sys

from nestgate.cli import main

sys.exit(main())
