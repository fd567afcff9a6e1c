"""The one trainer: task boundary, train state and steps, loop, checkpoints, optimizers, sharding,
monitor, run identity.
"""
