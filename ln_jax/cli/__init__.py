"""The command-line convention every entry point shares: `command` (--help, one-line user
errors with the command that works, typo suggestions, SIGTERM during set-up) and `help` (the
config fields as `--help` lists them). Reading the config itself is `ln_jax.config.load`."""
