"""Test set-up: 8 fake CPU devices, so that 2x2x2 meshes are really exercised."""

import os

# Must be set before JAX initialises its backends (first jax import anywhere in the session).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
