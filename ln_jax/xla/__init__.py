"""The tools that compile without running: `aot` (lower and compile the train step from
abstract values, memory reports), `compile_check` (its command line), `deviceless` (a GPU's or
TPU's compiler on a host without one), `kernel_census` and `matmul_census` (what a compiled
program's kernels and matmuls are). Nothing below this package imports it."""
