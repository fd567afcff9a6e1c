"""`python -m ln_jax.translate`: translate with a trained translation run (or a HuggingFace
Marian folder) and score BLEU. The command's implementation and its flags:
`ln_jax.models.translation.translate`."""

import sys

from ln_jax.models.translation.translate import main

if __name__ == "__main__":
    sys.exit(main())
