"""What this host has (an NVIDIA driver, TPU chips), read without starting JAX, and the quieting
of accelerator plugins that cannot run here.

`import ln_jax` calls `quiet_plugins()`. The `gpu-compile` and `tpu-compile` extras install
JAX's CUDA plugin and libtpu on a CPU host so that the step can be compiled for a GPU or TPU
without one (`ln_jax.xla.deviceless`). JAX then starts them in every process that lets it pick
its platforms; each fails, JAX runs on the CPU as it would without them, and each prints its
failure: the CUDA plugin a 20-line traceback of its cuDNN check, libtpu five lines of errors
about the TPU VM settings it looks for. On a host that cannot have the device, that is noise:

- the CUDA plugin's record is dropped from JAX's log when no NVIDIA driver file exists;
- libtpu is given the settings of a one-host, one-chip slice (`LIBTPU_QUIET`) when the host
  has no TPU chip, libtpu is installed, JAX is not asked for a TPU, and no TPU topology setting
  is set already (then all are left as they are, as JAX's own TPU set-up does).

On a host with the device nothing is changed: there a failure names a real problem.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
import pathlib

# Files an NVIDIA driver creates; without them no process on this host can run on a GPU.
NVIDIA_DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl")
CUDA_PLUGIN_ERROR = "Jax plugin configuration error: Exception when calling jax_plugins.xla_cuda"

GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips' PCI vendor (and gVNIC's, a GCE VM's network card)
# TPU chips' PCI device ids, v3 to TPU7x (JAX's list); a newer chip shows as a device node.
TPU_PCI_DEVICES = ("0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076")
PCI_DEVICES = "/sys/bus/pci/devices"
TPU_DEVICE_NODES = ("/dev/accel*", "/dev/vfio/[0-9]*")
# The settings libtpu reads on a TPU VM; set by hand, libtpu starts from them as given.
TPU_TOPOLOGY_VARS = (
    "TPU_ACCELERATOR_TYPE",
    "TPU_WORKER_HOSTNAMES",
    "TPU_HOST_BOUNDS",
    "TPU_CHIPS_PER_HOST_BOUNDS",
    "TPU_WORKER_ID",
)
# One host, one chip, no metadata server: libtpu starts without errors and finds no chip.
# No accelerator type: other code reads TPU_ACCELERATOR_TYPE as "this is a TPU VM".
LIBTPU_QUIET = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_HOST_BOUNDS": "1,1,1",
    "TPU_CHIPS_PER_HOST_BOUNDS": "1,1,1",
}


def has_nvidia_driver() -> bool:
    return any(os.path.exists(f) for f in NVIDIA_DRIVER_FILES)


def has_tpu_chips() -> bool:
    """Whether a TPU chip is attached: a PCI device of Google's with a TPU's device id (JAX's
    own test), or a TPU device node (`/dev/accel*`, `/dev/vfio/N`: chips JAX's list is too old
    to name)."""
    for device in glob.glob(os.path.join(PCI_DEVICES, "*")):
        if _read(device, "vendor") == GOOGLE_PCI_VENDOR and _read(device, "device") in (
            TPU_PCI_DEVICES
        ):
            return True
    return any(glob.glob(pattern) for pattern in TPU_DEVICE_NODES)


def _read(folder: str, name: str) -> str:
    try:
        return pathlib.Path(folder, name).read_text().strip()
    except OSError:
        return ""


def quiet_cuda_plugin() -> bool:
    """Drops the CUDA plugin's start-up traceback when this host has no NVIDIA driver.
    Returns whether the filter was installed."""
    if has_nvidia_driver():
        return False
    logger = logging.getLogger("jax._src.xla_bridge")
    if not_the_cuda_plugin_error not in logger.filters:
        logger.addFilter(not_the_cuda_plugin_error)
    return True


def not_the_cuda_plugin_error(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(CUDA_PLUGIN_ERROR)


def quiet_libtpu() -> dict[str, str]:
    """Sets LIBTPU_QUIET's values that are unset, where libtpu is installed, this host has no
    TPU chip, JAX is not asked for a TPU (JAX_PLATFORMS, JAX_FORCE_TPU_INIT) and no TPU
    topology setting is set. Returns what it set."""
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if (
        "tpu" in platforms.lower()
        or "JAX_FORCE_TPU_INIT" in os.environ
        or any(name in os.environ for name in TPU_TOPOLOGY_VARS)
        or not libtpu_installed()
        or has_tpu_chips()
    ):
        return {}
    added = {k: v for k, v in LIBTPU_QUIET.items() if k not in os.environ}
    os.environ.update(added)
    return added


def libtpu_installed() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def quiet_plugins() -> None:
    """Both of the above (at `import ln_jax`)."""
    quiet_cuda_plugin()
    quiet_libtpu()
