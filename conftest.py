"""Test-wide settings, applied before any test module imports jax or ray."""

import os

# CPU only, strict jax, and 8 fake devices so sharding is testable on one machine.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUMPY_RANK_PROMOTION", "raise")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
# Ray: no usage reporting (there is no network) and no dashboard for tests.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")


def pytest_configure(config):
    # `--dist loadgroup` that survives a crashed worker (tools/xdist_schedule.py says why); loaded by path, so
    # the repository root need not be importable (each package's own environment runs this conftest too).
    if config.pluginmanager.hasplugin("xdist"):
        import importlib.util
        from pathlib import Path

        path = Path(__file__).with_name("tools") / "xdist_schedule.py"
        spec = importlib.util.spec_from_file_location("schooner_xdist_schedule", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        config.pluginmanager.register(module, "schooner-xdist-schedule")
