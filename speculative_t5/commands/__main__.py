"""`python -m speculative_t5.commands`: the same as the `speculative-t5` command."""
import sys

from speculative_t5.commands import main

sys.exit(main())
