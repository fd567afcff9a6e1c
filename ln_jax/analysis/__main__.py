"""`python -m ln_jax.analysis SUBCOMMAND --out=DIR ...` (see `ln_jax.analysis.cli`)."""

import sys

from ln_jax.analysis.cli import main

if __name__ == "__main__":
    sys.exit(main())
