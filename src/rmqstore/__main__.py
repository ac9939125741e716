"""`python -m rmqstore`: the same command line as the `rmqstore` script."""
import sys

from .tools.cli import main

sys.exit(main())
