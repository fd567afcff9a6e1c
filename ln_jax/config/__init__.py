"""The typed run configuration and how it is read: `run` (TrainConfig and its sections),
`optim` (OptimConfig), `auto` (the platform's "auto" choices) and `load` (an ml_collections
config or a command line into a TrainConfig; no JAX import).

Import the module you need (`from ln_jax.config.run import TrainConfig`): this package's face
loads nothing, so that `ln_jax.config.load` stays light for the command line.
"""
