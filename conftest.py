"""Test-wide settings, applied before any test module imports jax or ray."""

import os

# CPU only, strict jax, and 8 fake devices so sharding is testable on one machine.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUMPY_RANK_PROMOTION", "raise")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
# XLA's CPU code generated without LLVM's optimisation passes (`--xla_backend_optimization_level=0`). The tests'
# programs are tiny, so compiling them costs more than running them, and LLVM's passes are most of the compile:
# lib/model's test_model.py took 39 CPU-s at level 0 against 80 at XLA's default, the whole suite about a third
# less. The HLO passes, the library kernels (matmuls) and the IEEE semantics are the same (no fast math either
# way); results can differ from the default level's in the last bits (an elementwise chain: 2218.50049 against
# 2218.50024), so every comparison a test makes is between programs of one level, or holds a tolerance. The
# default level stays tested: the tutorial's end-to-end test runs it as a user's shell does, at XLA's default
# (tests/test_tutorial.py). SCHOONER_TESTS_XLA_OPT=default runs the whole suite at XLA's default level (or =1,
# =2, =3 at that level); a level set in XLA_FLAGS before pytest starts is kept (but for that tutorial test).
_XLA_OPT = os.environ.get("SCHOONER_TESTS_XLA_OPT", "0")
if _XLA_OPT not in ("default", "0", "1", "2", "3"):
    raise ValueError(f"SCHOONER_TESTS_XLA_OPT={_XLA_OPT!r}: use 'default' (XLA's own level) or a level 0-3")
if _XLA_OPT != "default" and "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += f" --xla_backend_optimization_level={_XLA_OPT}"
# One persistent JAX compilation cache for the whole run, shared by the xdist workers and the processes the tests
# start (docs pages, `schooner run`, Ray workers): many tests compile the same small programs, and a hit skips
# XLA's compile (lib/model's tests: 19% less CPU time, 520 s -> 419 s). A fresh folder per run, removed at its
# end: nothing carries over between runs, nothing is written to the user's ~/.cache. A JAX_COMPILATION_CACHE_DIR
# set before pytest starts is used instead (and kept).
_COMPILE_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import tempfile

    _COMPILE_CACHE = tempfile.mkdtemp(prefix="schooner-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _COMPILE_CACHE
# jax's default keeps only programs that took over 1 s to compile: most here take less (also for a folder of yours)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
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


# The default suite's longest tests, started first: xdist hands tests to its two workers in collection order,
# and a long test collected last (the tutorial, ~65 s) ended runs with one worker busy and the other idle for
# as long. Substrings of node ids; the order within each part is unchanged.
LONG_FIRST = (
    "tests/test_tutorial.py::",
    "test_scaling_steps.py::test_sweep_fit_forecast_and_score",
    "test_sharding.py::",
    "test_sampling.py::test_greedy",
    "test_kernels",
    "packages/model.md",
    "packages/eval.md",
    "packages/train.md",
)


def pytest_unconfigure(config):
    if _COMPILE_CACHE is not None:  # the process that made the folder (the xdist controller) removes it
        import shutil

        shutil.rmtree(_COMPILE_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not any(s in item.nodeid for s in LONG_FIRST))
