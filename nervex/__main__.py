import sys

from nervex.entry.cli import main

sys.exit(main())
