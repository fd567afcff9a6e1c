"""What ln_jax needs to know of the host and the JAX runtime, imported from the lowest floor up:
`host` (accelerator plugins that cannot run here start quietly; no JAX import), `platforms`
(which platform runs, and what it supports) and `compile_cache` (XLA's persistent compilation
cache)."""
