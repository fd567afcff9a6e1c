"""`ln_jax.runtime.host`: what the host has, read without JAX, and the accelerator plugins that
cannot run here started quietly (in subprocesses: tests/test_deviceless.py and
tests/test_deviceless_tpu.py)."""

import logging

import pytest

from ln_jax.runtime import host


def test_the_cuda_plugin_s_start_up_error_is_dropped_only_without_a_driver(monkeypatch, tmp_path):
    """Without an NVIDIA driver the CUDA plugin's failed check is noise in every process and
    is dropped; with one it names a real problem and is kept."""

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("jax._src.xla_bridge", logging.ERROR, "", 0, message, (), None)

    dropped = "Jax plugin configuration error: Exception when calling %s.initialize()"
    assert not host.not_the_cuda_plugin_error(record(dropped % "jax_plugins.xla_cuda13"))
    assert host.not_the_cuda_plugin_error(record(dropped % "jax_plugins.xla_tpu"))
    assert host.not_the_cuda_plugin_error(record("Unable to initialize backend 'cuda'"))
    driver = tmp_path / "version"
    driver.write_text("NVRM version: 580")
    monkeypatch.setattr(host, "NVIDIA_DRIVER_FILES", (str(driver),))
    assert host.quiet_cuda_plugin() is False
    monkeypatch.setattr(host, "NVIDIA_DRIVER_FILES", (str(tmp_path / "absent"),))
    logger = logging.getLogger("jax._src.xla_bridge")
    before = list(logger.filters)
    try:
        logger.removeFilter(host.not_the_cuda_plugin_error)
        assert host.quiet_cuda_plugin() is True
        assert host.quiet_cuda_plugin() is True  # twice: one filter
        assert logger.filters.count(host.not_the_cuda_plugin_error) == 1
    finally:
        logger.filters[:] = before


def _pci(root, name: str, vendor: str, device: str) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "vendor").write_text(vendor + "\n")
    (folder / "device").write_text(device + "\n")


def test_tpu_chips_are_told_by_pci_id_or_device_node(monkeypatch, tmp_path):
    """A GCE VM's network card has Google's vendor id too: not a chip. A v5e's id is; so is a
    device node, for a chip newer than the id list."""
    pci = tmp_path / "pci"
    _pci(pci, "0000:00:04.0", "0x1ae0", "0x0042")  # gVNIC
    _pci(pci, "0000:00:05.0", "0x10de", "0x0063")  # NVIDIA's vendor, a TPU's device id
    monkeypatch.setattr(host, "PCI_DEVICES", str(pci))
    monkeypatch.setattr(host, "TPU_DEVICE_NODES", (str(tmp_path / "accel*"),))
    assert host.has_tpu_chips() is False
    (tmp_path / "accel0").write_text("")
    assert host.has_tpu_chips() is True
    (tmp_path / "accel0").unlink()
    _pci(pci, "0000:00:06.0", "0x1ae0", "0x0063")  # TPU v5e
    assert host.has_tpu_chips() is True


@pytest.fixture
def chipless_host_with_libtpu(monkeypatch):
    """A host as this test's: libtpu installed, no chip, no TPU settings in the environment."""
    asks = ("JAX_PLATFORMS", "JAX_FORCE_TPU_INIT")
    for name in (*host.TPU_TOPOLOGY_VARS, *host.LIBTPU_QUIET, *asks):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(host, "libtpu_installed", lambda: True)
    monkeypatch.setattr(host, "has_tpu_chips", lambda: False)
    return monkeypatch


def test_libtpu_is_quieted_only_where_it_cannot_run_and_nothing_was_set(
    chipless_host_with_libtpu,
):
    import os

    monkeypatch = chipless_host_with_libtpu
    assert host.quiet_libtpu() == host.LIBTPU_QUIET
    assert {k: os.environ[k] for k in host.LIBTPU_QUIET} == host.LIBTPU_QUIET
    assert "TPU_ACCELERATOR_TYPE" not in os.environ  # other code reads it as "a TPU VM"
    assert host.quiet_libtpu() == {}  # set already: nothing more
    for name in host.LIBTPU_QUIET:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")  # what JAX's own import sets without a chip
    assert set(host.quiet_libtpu()) == set(host.LIBTPU_QUIET) - {"TPU_SKIP_MDS_QUERY"}


@pytest.mark.parametrize(
    "setting",
    [
        ("JAX_PLATFORMS", "tpu,cpu"),
        ("JAX_FORCE_TPU_INIT", "1"),
        ("TPU_ACCELERATOR_TYPE", "v5litepod-8"),
        ("TPU_WORKER_HOSTNAMES", "10.0.0.2,10.0.0.3"),
        ("chips", True),
        ("libtpu", False),
    ],
)
def test_libtpu_is_left_alone_where_a_tpu_is_asked_for_or_set_up(
    chipless_host_with_libtpu, setting
):
    import os

    monkeypatch = chipless_host_with_libtpu
    name, value = setting
    if name == "chips":
        monkeypatch.setattr(host, "has_tpu_chips", lambda: value)
    elif name == "libtpu":
        monkeypatch.setattr(host, "libtpu_installed", lambda: value)
    else:
        monkeypatch.setenv(name, value)
    assert host.quiet_libtpu() == {}
    assert not any(k in os.environ for k in host.LIBTPU_QUIET if k != name)
