"""`python -m rmqstore`: the same command line as the `rmqstore` script."""
import sys

from .cli import main

sys.exit(main())
