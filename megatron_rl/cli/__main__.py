"""`python -m megatron_rl.cli COMMAND ...`: the same as the `megatron-rl` entry point."""

import sys

from megatron_rl.cli import main

sys.exit(main())
