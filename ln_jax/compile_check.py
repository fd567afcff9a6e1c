"""`python -m ln_jax.compile_check`: compile the train step for a mesh (or another platform's
devices) without running it, and print XLA's per-device memory. The command's implementation
and its flags: `ln_jax.xla.compile_check`."""

from ln_jax.xla.compile_check import run

if __name__ == "__main__":
    run()
