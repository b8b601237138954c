"""StepRunner in one process: order, caching, records, failures, selection, dry runs, concurrency."""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import fsspec
import pytest
from rich.console import Console

from schooner.cluster import (
    ConfigError,
    ResourceConfig,
    Secret,
    StepFailedError,
    StepRunner,
    lower,
    resolve_prefix,
    secret_field,
    step,
    using_client,
)
from schooner.cluster.records import meta_path

CALLS: list[str] = []
FAIL: set[str] = set()
"""Names of steps that raise, outside their configs (so fixing them keeps every key)."""
_calls_lock = threading.Lock()


@dataclass(frozen=True)
class Cfg:
    name: str
    inputs: Any = ()
    value: int = 1
    fail: bool = False
    hf_token: str | None = secret_field(None)


def _open(path: str, mode: str = "r"):
    return fsspec.open(path, mode).open() if "://" in path else open(path, mode)


def work(config: Cfg, out: str) -> dict:
    """Writes value + the sum of its inputs' values to out/value.txt."""
    with _calls_lock:
        CALLS.append(config.name)
    if config.fail or config.name in FAIL:
        raise ValueError(f"{config.name} was told to fail")
    total = config.value
    for path in config.inputs:
        with _open(f"{path}/value.txt") as f:
            total += int(f.read())
    with _open(f"{out}/value.txt", "w") as f:
        f.write(str(total))
    return {"total": total}


def graph(value: int = 1) -> dict[str, Any]:
    """a -> b -> d, a -> c -> d, and an independent e."""

    def mk(name: str, *inputs: Any) -> Any:
        return step(name, work, Cfg(name, inputs, value))

    a = mk("a")
    b = mk("b", a)
    c = mk("c", a)
    d = mk("d", b, c)
    e = mk("e")
    return {"a": a, "b": b, "c": c, "d": d, "e": e}


@pytest.fixture
def calls() -> list[str]:
    CALLS.clear()
    FAIL.clear()
    return CALLS


@pytest.fixture(params=["local", "memory"])
def prefix(request, tmp_path) -> str:
    return str(tmp_path / "out") if request.param == "local" else f"memory://runner-tests/{uuid.uuid4().hex}"


def _runner(prefix: str, **kw: Any) -> tuple[StepRunner, io.StringIO]:
    buf = io.StringIO()
    return StepRunner(prefix=prefix, console=Console(file=buf, width=200), **kw), buf


def _read(path: str) -> str:
    with _open(path) as f:
        return f.read()


def test_runs_inputs_first_then_reuses_everything(prefix: str, calls: list[str]) -> None:
    g = graph()
    runner, _ = _runner(prefix)
    result = runner.run([lower(g["d"]), g["e"]])
    assert result.ok and sorted(calls) == ["a", "b", "c", "d", "e"]
    assert calls.index("a") < calls.index("b") < calls.index("d") and calls.index("c") < calls.index("d")
    assert _read(f"{result[g['d']].output_path}/value.txt") == "5"  # d = 1 + (1+1) + (1+1)
    assert result[g["d"]].result == {"total": 5}
    assert result[g["d"]].output_path == f"{prefix}/d-{g['d'].key[:8]}"
    calls.clear()
    again = runner.run([graph()["d"], graph()["e"]])  # rebuilt handles, same keys
    assert calls == [] and again.ok and {o.state for o in again.steps} == {"cached"}
    assert again[g["d"]].result == {"total": 5}  # read back from the record


def test_records_hold_provenance_and_no_secrets(tmp_path, calls: list[str], monkeypatch) -> None:
    secret = "sk-" + uuid.uuid4().hex
    monkeypatch.setenv("MY_SERVICE_API_TOKEN", secret)
    prefix = str(tmp_path / "out")
    leaky = step(
        "leaky", work, Cfg("leaky", value=3, hf_token=secret), version="v2", description="writes three"
    )
    runner, buf = _runner(prefix)
    result = runner.run([leaky])
    out = result[leaky].output_path
    record = json.loads(_read(meta_path(out, "step.json")))
    assert record["name"] == "leaky" and record["key"] == leaky.key and record["version"] == "v2"
    assert record["config"]["value"] == 3 and "hf_token" not in record["config"]  # runtime-only
    assert record["state"] == "SUCCESS" and record["result"] == {"total": 3}
    assert record["ended"] >= record["started"] > 0
    # The version of the package as installed (its pyproject), not a figure copied into the test.
    installed = importlib.metadata.version("schooner-cluster")
    assert record["env"]["host"] and record["env"]["packages"]["schooner-cluster"] == installed
    assert record["env"]["git"] is None or len(record["env"]["git"]["commit"]) == 40
    status = json.loads(_read(meta_path(out, "status.json")))
    assert status["status"] == "SUCCESS" and status["key"] == leaky.key
    # A failing step whose error message carries the secret value: scrubbed in records and output.
    bad = step("bad", work, Cfg(f"token {secret} inside", fail=True))
    failed = runner.run([bad], raise_on_failure=False)
    assert not failed.ok
    bad_record = _read(meta_path(failed[bad].output_path, "step.json"))
    assert "was told to fail" in bad_record
    everything = [bad_record, buf.getvalue()] + [_read(p) for p in _all_files(prefix)]
    assert all(secret not in text for text in everything)


@dataclass(frozen=True)
class Login:
    user: str
    password: Secret
    num_experts_per_token: int = 2


def log_in(config: Login, out: str) -> None:
    raise PermissionError(f"the server refused password {config.password.get()!r}")


def test_a_marked_secret_stays_out_of_the_key_records_and_output(tmp_path, capfd) -> None:
    """A `Secret` is never part of the key nor of anything the runner writes or prints, even when the step
    puts it in its error; a setting named like a token is recorded as it is."""
    secret = "pw-" + uuid.uuid4().hex
    h = step("login", log_in, Login("ada", Secret(secret)))
    assert h.key == step("login", log_in, Login("ada", Secret("another-password"))).key
    prefix = str(tmp_path / "out")
    runner, buf = _runner(prefix)
    failed = runner.run([h], raise_on_failure=False)
    assert not failed.ok
    record = json.loads(_read(meta_path(failed[h].output_path, "step.json")))
    assert record["config"] == {
        "__class__": "Login",
        "user": "ada",
        "password": None,
        "num_experts_per_token": 2,
    }
    assert "the server refused password" in record["error"]
    out, err = capfd.readouterr()
    everything = [buf.getvalue(), out, err] + [_read(p) for p in _all_files(prefix)]
    assert all(secret not in text for text in everything)
    assert any("***" in text for text in everything)


def prints_its_password(config: Login, out: str) -> None:
    print(f"logging in with {config.password.get()}")
    sys.stderr.write(f"retrying with {config.password.get()}\n")


def test_what_an_in_process_step_prints_is_scrubbed_of_its_secrets(tmp_path, capfd) -> None:
    """A worker's output is scrubbed when its log is read; an in-process step prints straight to the
    console, so the runner scrubs sys.stdout and sys.stderr while it runs (and restores them after)."""
    secret = "pw-" + uuid.uuid4().hex
    stdout, stderr = sys.stdout, sys.stderr
    h = step("printer", prints_its_password, Login("ada", Secret(secret)))
    runner, buf = _runner(str(tmp_path / "out"))
    assert runner.run([h]).ok
    out, err = capfd.readouterr()
    assert "logging in with ***" in out and "retrying with ***" in err
    assert secret not in out + err + buf.getvalue()
    assert sys.stdout is stdout and sys.stderr is stderr


def _all_files(root: str) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]


def test_a_failure_stops_its_dependents_only_and_a_rerun_resumes_there(prefix: str, calls: list[str]) -> None:
    g = graph()
    FAIL.add("b")
    runner, buf = _runner(prefix)
    with pytest.raises(StepFailedError) as err:
        runner.run([g["d"], g["e"]])
    result = err.value.result
    states = {o.name: o.state for o in result.steps}
    assert states == {"a": "succeeded", "b": "failed", "c": "succeeded", "d": "skipped", "e": "succeeded"}
    assert "d" not in calls
    assert "b: ValueError: b was told to fail" in str(err.value)
    assert result["d"].error == "input 'b' failed"
    text = buf.getvalue()
    assert "FAILED" in text and "not run" in text and "b was told to fail" in text
    assert json.loads(_read(meta_path(result["b"].output_path, "status.json")))["status"] == "FAILED"
    # Fixed (the code, not the config: same keys): the rerun resumes at b.
    FAIL.clear()
    calls.clear()
    again = runner.run([g["d"], g["e"]])
    assert again.ok and sorted(calls) == ["b", "d"]
    assert {o.name for o in again.cached} == {"a", "c", "e"}
    # The status says SUCCESS now; the step's history keeps the earlier failure with its traceback.
    history = [
        json.loads(ln) for ln in _read(meta_path(result["b"].output_path, "history.jsonl")).splitlines()
    ]
    assert [h["state"] for h in history] == ["FAILED", "SUCCESS"]
    assert "ValueError: b was told to fail" in history[0]["error"] and history[1]["error"] is None
    assert history[0]["run_id"] == result.run_id and history[1]["run_id"] == again.run_id


def test_run_only_pulls_in_inputs_and_force_reruns_matches(prefix: str, calls: list[str]) -> None:
    g = graph()
    runner, _ = _runner(prefix)
    result = runner.run([g["d"], g["e"]], run_only=["^b$"])
    assert sorted(calls) == ["a", "b"] and [o.name for o in result.steps] == ["a", "b"]
    calls.clear()
    runner.run([g["d"], g["e"]])
    assert sorted(calls) == ["c", "d", "e"]
    calls.clear()
    runner.run([g["d"], g["e"]], force="^(a|c)$")
    # Their dependents rerun on the replaced outputs (issue 36: they were reported cached); e reads neither.
    assert sorted(calls) == ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match="'nope' matches no step; steps are: a, b, c, d, e"):
        runner.run([g["d"], g["e"]], run_only="nope")
    with pytest.raises(ValueError, match="not a valid regular expression"):
        runner.run([g["d"]], force="(")


def test_dry_run_writes_nothing_and_prints_the_plan(prefix: str, calls: list[str]) -> None:
    g = graph()
    runner, buf = _runner(prefix)
    runner.run([g["a"]])
    before = _listing(prefix)
    result = runner.run([g["d"], g["e"]], dry_run=True)
    assert calls == ["a"] and _listing(prefix) == before
    assert {o.name: o.state for o in result.steps} == {
        "a": "cached",
        "b": "will_run",
        "c": "will_run",
        "d": "will_run",
        "e": "will_run",
    }
    plan = buf.getvalue()
    assert "dry run" in plan and "will run d" in plan and "cached a" in plan
    fresh, _ = _runner(prefix + "-never")
    fresh.run([g["d"]], dry_run=True)
    assert _listing(prefix + "-never") == []


def _listing(prefix: str) -> list[tuple[str, int]]:
    if "://" in prefix:
        fs, root = fsspec.core.url_to_fs(prefix)
        if not fs.exists(root):
            return []
        return sorted((p, fs.size(p)) for p in fs.find(root))
    return sorted((p, os.path.getsize(p)) for p in _all_files(prefix)) if os.path.exists(prefix) else []


BARRIER = threading.Barrier(3)
ACTIVE = {"now": 0, "max": 0}


def meet(config: dict, out: str) -> None:
    BARRIER.wait(timeout=20)  # only passes if the three steps run at the same time


def count_active(config: dict, out: str) -> None:
    with _calls_lock:
        ACTIVE["now"] += 1
        ACTIVE["max"] = max(ACTIVE["max"], ACTIVE["now"])
    time.sleep(0.05)
    with _calls_lock:
        ACTIVE["now"] -= 1


def test_independent_steps_run_concurrently_up_to_max_concurrent(tmp_path) -> None:
    runner, _ = _runner(str(tmp_path))
    assert runner.run([step(f"m{i}", meet, {"i": i}) for i in range(3)]).ok
    ACTIVE.update(now=0, max=0)
    runner.run([step(f"n{i}", count_active, {"i": i}) for i in range(5)], max_concurrent=1)
    assert ACTIVE["max"] == 1
    ACTIVE.update(now=0, max=0)
    runner.run([step(f"p{i}", count_active, {"i": i}) for i in range(6)], max_concurrent=2)
    assert 1 <= ACTIVE["max"] <= 2


def test_override_output_path_is_used_recorded_and_guarded(tmp_path, calls: list[str]) -> None:
    target = str(tmp_path / "exported")
    h = step("export", work, Cfg("export", value=7), override_output_path=target)
    runner, _ = _runner(str(tmp_path / "prefix"))
    assert runner.run([h])[h].output_path == target
    assert _read(f"{target}/value.txt") == "7"
    assert json.loads(_read(meta_path(target, "step.json")))["override_output_path"] is True
    other = step("export", work, Cfg("export", value=8), override_output_path=target)
    with pytest.raises(ConfigError, match="already holds a different step"):
        runner.run([other])


def test_a_missing_input_path_names_the_step_and_field(tmp_path) -> None:
    a = step("a", work, Cfg("a"))
    user = step("user", work, Cfg("user", inputs=(a / "no-such-dir",)))
    runner, _ = _runner(str(tmp_path))
    result = runner.run([user], raise_on_failure=False)
    assert result["a"].state == "succeeded" and result["user"].state == "failed"
    assert "step 'user': config field 'config.inputs[0]'" in result["user"].error
    assert "no-such-dir" in result["user"].error


def steal_lease(config: dict, out: str) -> None:
    """Simulates this runner stalling past its ttl: another runner's lease replaces ours."""
    # `out` is this attempt's own folder, `.{name}-{key8}.attempt-{owner}` beside the step's output.
    published = os.path.join(os.path.dirname(out), os.path.basename(out)[1:].split(".attempt-")[0])
    path = meta_path(published, "lease.json")
    with open(path) as f:
        lease = json.load(f)
    lease.update(owner="thief", run_id="thief", heartbeat=time.time() + 3600)
    with open(path, "w") as f:
        json.dump(lease, f)


def test_a_step_whose_lease_was_taken_over_is_not_marked_success(tmp_path) -> None:
    h = step("stolen", steal_lease, {})
    runner, _ = _runner(str(tmp_path))
    result = runner.run([h], raise_on_failure=False)
    assert result[h].state == "failed" and result[h].error_type == "LeaseLostError"
    assert (
        not os.path.exists(meta_path(result[h].output_path, "status.json"))
        or json.loads(_read(meta_path(result[h].output_path, "status.json")))["status"] != "SUCCESS"
    )


def test_experiment_record_lists_the_run(tmp_path) -> None:
    g = graph()
    runner, _ = _runner(str(tmp_path))
    result = runner.run([g["d"]])
    record = json.loads(_read(result.experiment_record))
    assert result.experiment_record.startswith(str(tmp_path / "experiments") + "/")
    assert record["ok"] is True and record["run_id"] == result.run_id
    assert [(s["name"], s["state"]) for s in record["steps"]] == [
        ("a", "succeeded"),
        ("b", "succeeded"),
        ("c", "succeeded"),
        ("d", "succeeded"),
    ]
    # Every run keeps its own record: a failed run is not overwritten by the next one.
    FAIL.add("e")
    failed = runner.run([g["d"], g["e"]], raise_on_failure=False)
    FAIL.clear()
    fixed = runner.run([g["d"], g["e"]])
    records = [json.loads(_read(r.experiment_record)) for r in (failed, fixed)]
    assert [r["ok"] for r in records] == [False, True]
    assert len({failed.experiment_record, fixed.experiment_record, result.experiment_record}) == 3
    assert all(os.path.exists(r.experiment_record) for r in (result, failed, fixed))


def test_prefix_comes_from_argument_env_or_working_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCHOONER_PREFIX", raising=False)
    assert resolve_prefix() == str(tmp_path / "schooner-output")
    monkeypatch.setenv("SCHOONER_PREFIX", "memory://from-env/")
    assert resolve_prefix() == "memory://from-env"
    assert resolve_prefix("file:///data/x") == "/data/x"
    assert resolve_prefix("rel") == str(tmp_path / "rel")
    assert StepRunner().prefix == "memory://from-env"


def pid_step(config: dict, out: str) -> dict:
    with open(os.path.join(out, "pid.txt"), "w") as f:
        f.write(str(os.getpid()))
    if config.get("fail"):
        print("about to fail: remote failure on purpose", flush=True)
        raise RuntimeError("remote failure on purpose")
    return {"pid": os.getpid()}


def test_steps_with_resources_run_through_the_client(tmp_path, local_client) -> None:
    ok = step("remote", pid_step, {"n": 1}, resources=ResourceConfig.with_cpu(1))
    bad = step("remote-bad", pid_step, {"fail": True}, resources=ResourceConfig.with_cpu(1))
    runner, _ = _runner(str(tmp_path))
    with using_client(local_client):
        result = runner.run([ok, bad], raise_on_failure=False)
    assert result[ok].state == "succeeded", result[ok].error
    assert result[ok].result["pid"] != os.getpid()
    assert _read(f"{result[ok].output_path}/pid.txt") == str(result[ok].result["pid"])
    assert result[bad].state == "failed" and "remote failure on purpose" in result[bad].error
    # What the job printed is kept next to the record (the worker prints a secret-free line here).
    assert "remote failure on purpose" in _read(meta_path(result[bad].output_path, "job.log"))


STARTED = threading.Event()


def slow_once(config: dict, out: str) -> str:
    with _calls_lock:
        CALLS.append("slow")
    STARTED.set()
    time.sleep(config["seconds"])
    return "done"


def test_a_second_runner_waits_for_a_live_lease_kept_fresh_by_heartbeats(tmp_path, calls: list[str]) -> None:
    # The step runs 2.5x longer than the lease ttl: only heartbeats keep the second runner from taking over.
    h = step("slow", slow_once, {"seconds": 2.5})
    STARTED.clear()
    first, buf1 = _runner(str(tmp_path), lease_ttl=1.0, heartbeat_s=0.05)
    second, buf2 = _runner(str(tmp_path), lease_ttl=1.0, heartbeat_s=0.05)
    results = {}
    t = threading.Thread(target=lambda: results.setdefault("first", first.run([h])))
    t.start()
    assert STARTED.wait(20)
    results["second"] = second.run([h])
    t.join(30)
    assert calls == ["slow"]
    assert results["first"][h].state == "succeeded"
    assert results["second"][h].state == "cached" and "finished by run" in results["second"][h].note
    assert "wait" in buf2.getvalue() and results["second"][h].result == "done"


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_steps_with_resources_run_on_ray(tmp_path, ray_client) -> None:
    h = step("on-ray", pid_step, {"n": 2}, resources=ResourceConfig.with_cpu(1))
    runner, _ = _runner(str(tmp_path), client=ray_client)
    result = runner.run([h], raise_on_failure=False)
    assert result.ok, result[h].error
    assert result[h].result["pid"] != os.getpid()
    assert _read(f"{result[h].output_path}/pid.txt") == str(result[h].result["pid"])


def test_an_empty_run_does_nothing(tmp_path) -> None:
    runner, _ = _runner(str(tmp_path / "out"))
    result = runner.run([])
    assert result.ok and result.steps == [] and not (tmp_path / "out").exists()


def test_memory_prefix_refuses_steps_that_run_in_workers() -> None:
    h = step("remote", pid_step, {"n": 3}, resources=ResourceConfig.with_cpu(1))
    runner, _ = _runner(f"memory://runner-tests/{uuid.uuid4().hex}")
    with pytest.raises(ConfigError, match="'remote' has resources.*memory://"):
        runner.run([h])


def which_client(config: dict, out: str) -> str:
    from schooner.cluster import current_client

    return type(current_client()).__name__ + f"@{id(current_client())}"


def test_the_runner_client_is_current_inside_in_process_steps(tmp_path, local_client) -> None:
    h = step("which", which_client, {})
    runner, _ = _runner(str(tmp_path), client=local_client)
    assert runner.run([h])[h].result == f"LocalClient@{id(local_client)}"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("WANDB_API_KEY", True),
        ("DB_PASSWORD", True),
        ("AUTHORIZATION", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("PATH", False),
        ("KEYBOARD_LAYOUT", False),
    ],
)
def test_environment_variables_are_judged_by_name_config_fields_never(name: str, secret: bool) -> None:
    from schooner.cluster import is_secret_name
    from schooner.cluster.runner._records import redact_config

    assert is_secret_name(name) is secret
    config = {name.lower(): "value", "num_experts_per_token": 2, "eot_token": "</s>", "api_key": "k"}
    assert redact_config(config, []) == config  # marked secrets never reach a canonical config


def test_scan_prefix_finds_step_folders_with_their_states(prefix: str) -> None:
    from schooner.cluster.views import scan_prefix

    g = graph()
    FAIL.clear()
    FAIL.add("c")
    runner, _ = _runner(prefix)
    runner.run([g["d"], g["e"]], raise_on_failure=False)
    FAIL.clear()
    found = {f.status.name: f.status.state.value for f in scan_prefix(prefix)}
    assert found == {"a": "SUCCESS", "b": "SUCCESS", "c": "FAILED", "e": "SUCCESS"}  # d never started
    assert all(f.output_path.startswith(prefix + "/") for f in scan_prefix(prefix))


def test_a_force_that_matches_no_step_is_an_error_not_a_silent_no_op(prefix: str, calls: list[str]) -> None:
    # A typo in --force ("tokenise" for "tokenize") ran nothing and reported every step cached: the user
    # believed the step had been redone. run_only already refuses a pattern that matches nothing.
    g = graph()
    runner, _ = _runner(prefix)
    runner.run([g["d"], g["e"]])
    calls.clear()
    with pytest.raises(ConfigError, match="force 'nope' matches no step; steps are: a, b, c, d, e"):
        runner.run([g["d"], g["e"]], force="nope")
    # A forced step left out by run_only is not in the run either: said, not ignored.
    with pytest.raises(ConfigError, match=r"force '\^e\$' matches no step of this run; steps are: a, b"):
        runner.run([g["d"], g["e"]], run_only="^b$", force="^e$")
    assert calls == []
    with pytest.raises(ConfigError, match="force 'nope'"):
        runner.run([g["d"], g["e"]], force=["^a$", "nope"], dry_run=True)
    assert calls == []
    # From the command line, --force applies to every run() of a script, and each may run other steps:
    # the plan says so, nothing is refused.
    runner, buf = _runner(prefix)
    result = runner.main([g["d"], g["e"]], argv=["--force", "nope"])
    assert result.ok and calls == [] and len(result.cached) == 5
    assert "--force 'nope' matches no step; steps are: a, b, c, d, e" in buf.getvalue()


def _exits(config: dict, output_path: str) -> dict:
    sys.exit(config["code"])


def _after(config: dict, output_path: str) -> dict:
    return {"ran": True}


def test_an_in_process_step_calling_sys_exit_fails_that_step_not_the_run(prefix: str) -> None:
    # A `main()` reused as a step ends with sys.exit(0): the whole run ended there with exit status 0,
    # no summary, the other steps unrun and the code after run() never reached (in a worker, the same step
    # already failed cleanly).
    zero = step("exit/zero", _exits, {"code": 0})
    three = step("exit/three", _exits, {"code": 3})
    later = step("exit/after", _after, {"x": zero})
    alone = step("exit/alone", _after, {"y": 1})
    runner, buf = _runner(prefix)
    result = runner.run([later, three, alone], raise_on_failure=False)
    states = {o.name: o.state for o in result.steps}
    assert states == {
        "exit/zero": "failed",
        "exit/three": "failed",
        "exit/after": "skipped",
        "exit/alone": "succeeded",
    }
    assert result[zero].error is not None and "SystemExit: 0" in result[zero].error
    assert result[three].error is not None and "SystemExit: 3" in result[three].error
    assert "exit/zero" in buf.getvalue() and "FAILED" in buf.getvalue()
    with pytest.raises(StepFailedError, match="exit/three"):
        runner.run([three])


def _curve(config: dict, output_path: str) -> dict:
    np = pytest.importorskip("numpy")
    return {"loss": np.arange(config["n"], dtype=np.float32) / 4, "eye": np.eye(2, dtype=np.int64)}


def test_a_numpy_array_in_a_result_is_recorded_as_its_values(prefix: str) -> None:
    # A step returned its eval curve as a numpy array: the record held repr(), numpy's abbreviated text
    # 'array([  0.  ,   0.25, ...,  499.75])', so 1,996 of its 2,000 values were gone, cached or not.
    pytest.importorskip("numpy")
    h = step("curve", _curve, {"n": 2000})
    runner, _ = _runner(prefix)
    expect = {"loss": [i / 4 for i in range(2000)], "eye": [[1, 0], [0, 1]]}
    assert runner.run([h])[h].result == expect
    again = runner.run([h])
    assert again.cached and again[h].result == expect


def test_a_step_name_with_regex_characters_is_matched_by_itself(prefix: str, calls: list[str]) -> None:
    # Names may hold '+' and '.' ('grid/lr+1e-3'); --only/--force take regexes, so the name copied from the
    # status table matched nothing ('+' repeats the 'r').
    a = step("grid/lr+1e-3", work, Cfg("grid/lr+1e-3"))
    b = step("grid/lr+1e-2", work, Cfg("grid/lr+1e-2"))
    runner, _ = _runner(prefix)
    result = runner.run([a, b], run_only="grid/lr+1e-3")
    assert [o.name for o in result.steps] == ["grid/lr+1e-3"] and calls == ["grid/lr+1e-3"]
    calls.clear()
    runner.run([a, b])
    calls.clear()
    runner.run([a, b], force="grid/lr+1e-2")
    assert calls == ["grid/lr+1e-2"]


def test_a_pattern_that_is_a_step_s_name_picks_that_step_alone(prefix: str, calls: list[str]) -> None:
    # `--force n/exact+v1`, the name copied from the status table, also forced 'n/exactv1' ('t+' matches 't' as
    # a regex); a pattern that is the exact name of a step of the run selects that step alone.
    a = step("n/exact+v1", work, Cfg("n/exact+v1"))
    b = step("n/exactv1", work, Cfg("n/exactv1"))
    runner, _ = _runner(prefix)
    runner.run([a, b])
    calls.clear()
    runner.run([a, b], force="n/exact+v1")
    assert calls == ["n/exact+v1"]
    calls.clear()
    result = runner.run([a, b], run_only="n/exact+v1")
    assert [o.name for o in result.steps] == ["n/exact+v1"]
    calls.clear()
    runner.run([a, b], force="n/exact")  # not a name: a regex, as before
    assert sorted(calls) == ["n/exact+v1", "n/exactv1"]


def test_a_failed_steps_traceback_starts_at_its_own_function(tmp_path, calls: list[str]) -> None:
    # The runner's own frames (executing the step, calling its function) say nothing about why a step
    # failed: the error shown and recorded starts at the step's function, whichever runner module called it.
    h = step("tb", work, Cfg("tb", fail=True))
    runner, _ = _runner(str(tmp_path))
    result = runner.run([h], raise_on_failure=False)
    error = result[h].error or ""
    frames = [line for line in error.splitlines() if line.startswith('  File "')]
    assert frames and "in work" in frames[0], error
    assert "schooner/cluster/runner" not in error, error
