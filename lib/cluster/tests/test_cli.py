"""The `schooner` command with real processes: run, dry run, status, explain, failures, bad files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "experiments_data"
CHAIN = str(HERE / "chain.py")


def schooner(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "COLUMNS": "250", **(env or {})}
    full_env.pop("SCHOONER_PREFIX", None)
    return subprocess.run(
        [sys.executable, "-m", "schooner.cluster.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )


def log_lines(path: Path) -> list[tuple[str, str]]:
    """(event, step) pairs from the chain experiment's EXP_LOG."""
    if not path.exists():
        return []
    return [tuple(line.split()[:2]) for line in path.read_text().splitlines()]


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow  # one of the default suite's heaviest (20-70 s on 2 cores); covered in part by faster tests
def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path) -> None:
    prefix = tmp_path / "out"
    proc = schooner(
        "run", CHAIN, "--dry-run", "--prefix", str(prefix), env={"EXP_LOG": str(tmp_path / "log")}
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "dry run" in proc.stdout
        and "will run report/total" in proc.stdout
        and "will run numbers" in proc.stdout
    )
    assert not prefix.exists() and not (tmp_path / "log").exists()
    # Directly as a script: the same flags are understood.
    direct = subprocess.run(
        [sys.executable, CHAIN, "--dry-run", "--prefix", str(prefix)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "250"},
        timeout=120,
    )
    assert direct.returncode == 0, direct.stderr
    assert "will run squares" in direct.stdout and not prefix.exists()
    # The script stops after the plan: code after run() that needs real results never runs.
    stops = schooner("run", str(HERE / "with_resources.py"), "--dry-run", "--prefix", str(prefix))
    assert stops.returncode == 0, stops.stdout + stops.stderr
    assert "will run counted" in stops.stdout and "RESULT" not in stops.stdout and not prefix.exists()


@pytest.mark.slow  # one of the default suite's heaviest (20-70 s on 2 cores); covered in part by faster tests
def test_run_then_status_then_explain_names_the_changed_field(tmp_path) -> None:
    prefix, log = tmp_path / "out", tmp_path / "log"
    proc = schooner("run", CHAIN, "--prefix", str(prefix), env={"EXP_LOG": str(log)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(s for e, s in log_lines(log) if e == "end") == [
        "cubes",
        "numbers",
        "report/total",
        "squares",
    ]
    total = [json.loads(x) for x in (next(prefix.glob("report/total-*")) / "part-1.json").read_text().split()]
    assert total == [sum((3 * i) ** 2 + 2 * (3 * i) ** 3 for i in range(6))]

    status = schooner("status", "--prefix", str(prefix))
    assert status.returncode == 0
    rows = [ln for ln in status.stdout.splitlines() if "SUCCESS" in ln]
    assert len(rows) == 4 and any("report/total" in r for r in rows)
    assert "4 success" in status.stdout
    rows = json.loads(schooner("status", "--prefix", str(prefix), "--json", "--name", "^report").stdout)
    assert [(r["name"], r["state"]) for r in rows] == [("report/total", "SUCCESS")]
    assert rows[0]["output_path"].startswith(str(prefix)) and len(rows[0]["key"]) == 64

    same = schooner("explain", "report/total", CHAIN, "--prefix", str(prefix))
    assert same.returncode == 0 and "reused" in same.stdout

    changed = schooner("explain", "squares", CHAIN, "--prefix", str(prefix), env={"EXP_SCALE": "4"})
    assert changed.returncode == 0, changed.stderr
    text = changed.stdout
    assert "squares" in text and "will run" in text
    assert "config.numbers" in text  # the input whose key changed...
    assert "config.scale: 3 -> 4" in text  # ...and, explained in turn, the field that started it
    report = schooner(
        "explain", "report/total", CHAIN, "--prefix", str(prefix), env={"EXP_SCALE": "4"}
    ).stdout
    assert (
        "config.parts[<step 'squares'>]<key>: <step 'squares'" in report and "config.scale: 3 -> 4" in report
    )

    # Rerun with the change; without the experiment file, explain compares the two latest records.
    assert schooner("run", CHAIN, "--prefix", str(prefix), env={"EXP_SCALE": "4"}).returncode == 0
    history = schooner("explain", "numbers", "--prefix", str(prefix))
    assert history.returncode == 0 and "config.scale: 3 -> 4" in history.stdout


@pytest.mark.slow
def test_a_failing_step_exits_non_zero_and_a_rerun_resumes_there(tmp_path) -> None:
    prefix, log = tmp_path / "out", tmp_path / "log"
    proc = schooner("run", CHAIN, "--prefix", str(prefix), env={"EXP_LOG": str(log), "EXP_FAIL": "cubes"})
    assert proc.returncode == 1
    out = proc.stdout
    assert "FAILED" in out and "cubes failed on purpose" in out and "input 'cubes' failed" in out
    assert ("start", "report/total") not in log_lines(log)
    log.unlink()
    only = schooner("run", CHAIN, "--prefix", str(prefix), "--only", "^cubes$", env={"EXP_LOG": str(log)})
    assert only.returncode == 0, only.stdout
    assert [s for e, s in log_lines(log) if e == "start"] == ["cubes"]  # its inputs are done already
    again = schooner("run", CHAIN, "--prefix", str(prefix), "--force", "^numbers$", env={"EXP_LOG": str(log)})
    assert again.returncode == 0, again.stdout
    assert sorted(s for e, s in log_lines(log) if e == "start") == ["cubes", "numbers", "report/total"]


@pytest.mark.slow
def test_kill_9_mid_step_then_rerun_takes_over_and_matches_an_uninterrupted_run(tmp_path) -> None:
    prefix, log = tmp_path / "out", tmp_path / "log"
    env = {**os.environ, "EXP_LOG": str(log), "EXP_SLEEP": "squares=60", "COLUMNS": "250"}
    driver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "schooner.cluster.cli",
            "run",
            CHAIN,
            "--prefix",
            str(prefix),
            "--max-concurrent",
            "1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(lambda: ("start", "squares") in log_lines(log), driver)
        squares = next(prefix.glob("squares-*"))
        # It writes into its attempt's own folder beside the output (published whole when it is done).
        _wait_for(lambda: any(prefix.glob(f".{squares.name}.attempt-*/part-0.json")), driver)
        driver.kill()  # SIGKILL: no cleanup of any kind
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    status = json.loads((squares / ".schooner" / "status.json").read_text())
    assert status["status"] == "RUNNING" and not (squares / "part-1.json").exists()  # partial, never SUCCESS
    status = schooner("status", "--prefix", str(prefix)).stdout
    assert any("squares" in ln and "INTERRUPTED" in ln for ln in status.splitlines()), status
    why = schooner("explain", "squares", CHAIN, "--prefix", str(prefix)).stdout
    assert "will resume" in why and "died while running it" in " ".join(why.split())
    before = log_lines(log)
    rerun = schooner("run", CHAIN, "--prefix", str(prefix), env={"EXP_LOG": str(log)})
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "took over a stale lease" in rerun.stdout
    second = log_lines(log)[len(before) :]
    assert ("start", "numbers") not in second  # finished before the kill: skipped
    assert ("end", "squares") in second
    clean = tmp_path / "clean"
    assert schooner("run", CHAIN, "--prefix", str(clean)).returncode == 0
    assert _outputs(prefix) == _outputs(clean)


def _outputs(prefix: Path) -> dict[str, bytes]:
    """The step outputs, without the runner's own (timestamped) files."""
    return {
        k: v
        for k, v in files_under(prefix).items()
        if ".schooner" not in k and not k.startswith("experiments")
    }


def _wait_for(cond, proc: subprocess.Popen, timeout: float = 60) -> None:
    import time

    deadline = time.time() + timeout
    while not cond():
        assert proc.poll() is None, "the driver exited early"
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def test_two_drivers_on_one_prefix_run_every_step_exactly_once(tmp_path) -> None:
    prefix, log, gate = tmp_path / "out", tmp_path / "log", tmp_path / "gate"
    env = {**os.environ, "EXP_LOG": str(log), "EXP_GATE": str(gate), "COLUMNS": "250"}
    env.update(EXP_SLEEP="squares=0.3,cubes=0.3,report/total=0.2")
    cmd = [sys.executable, "-m", "schooner.cluster.cli", "run", CHAIN, "--prefix", str(prefix)]
    drivers = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    try:
        # `numbers` is held until both drivers are in: one runs it, the other must wait on its lease.
        waiting = []
        for d in drivers:
            for line in d.stdout:
                waiting.append(line)
                if "start   numbers" in line or "wait" in line:
                    break
        assert sum("wait" in ln for ln in waiting) == 1, waiting
        gate.touch()
        outs = ["".join(waiting) + d.communicate(timeout=120)[0] for d in drivers]
    finally:
        for d in drivers:
            if d.poll() is None:
                d.kill()
                d.communicate()
    assert [d.returncode for d in drivers] == [0, 0], outs
    starts = [s for e, s in log_lines(log) if e == "start"]
    assert sorted(starts) == ["cubes", "numbers", "report/total", "squares"]
    assert any("finished by another runner" in o for o in outs)


@pytest.mark.parametrize(
    ("file", "code", "words"),
    [
        ("bad_cycle.py", 2, ["cycle between steps", "'loop' (field config['previous'])", "bad_cycle.py:15"]),
        (
            "bad_unserialisable.py",
            2,
            ["step 'holds-a-lock'", "config field 'config.lock'", "bad_unserialisable.py:19"],
        ),
        ("bad_missing_input.py", 1, ["step 'user': config field 'config.data'", "trian"]),
    ],
)
def test_bad_experiment_files_name_the_step_and_field(
    tmp_path, file: str, code: int, words: list[str]
) -> None:
    proc = schooner("run", str(HERE / file), "--prefix", str(tmp_path / "out"))
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == code, text
    for w in words:
        assert w in text


def test_a_file_that_only_declares_steps_runs_them_all(tmp_path) -> None:
    proc = schooner("run", str(HERE / "declares_only.py"), "--prefix", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (next(tmp_path.glob("greet-*")) / "hello.txt").read_text() == "hello"


def test_explain_of_an_unknown_step_lists_the_steps(tmp_path) -> None:
    proc = schooner("explain", "nope", CHAIN, "--prefix", str(tmp_path))
    assert proc.returncode == 2 and "no step named 'nope'" in proc.stdout and "squares" in proc.stdout


def test_steps_with_resources_go_through_the_cluster_given_on_the_command_line(tmp_path) -> None:
    proc = schooner("run", str(HERE / "with_resources.py"), "--prefix", str(tmp_path), "--cluster", "local")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "counted (cluster)" in proc.stdout and "words (in process)" in proc.stdout
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    assert "'count': 2" in line
    remote_pid, runner_pid = int(line.split("'pid': ")[1].split("}")[0]), int(line.split()[-1])
    assert remote_pid != runner_pid  # ran in a worker process, not in the runner
    bad = schooner("run", str(HERE / "with_resources.py"), "--prefix", str(tmp_path), "--cluster", "bogus!")
    assert bad.returncode == 2 and "--cluster" in bad.stdout and "not a cluster spec" in bad.stdout


def test_script_flags_leave_the_scripts_own_flags_alone(monkeypatch) -> None:
    from schooner.cluster.cli._flags import options_from_argv
    from schooner.cluster.runner._options import run_flags_in

    assert options_from_argv(["--pre", "x", "-f", "kernel.json"]) is None  # no abbreviations, no -f
    assert run_flags_in(["--pre", "x", "-f", "kernel.json"]) == []
    argv = ["--steps", "3", "--dry-run", "--only", "a", "--force=b", "--force", "c"]
    opts = options_from_argv(argv)
    assert opts is not None and opts.dry_run and opts.only == ("a",) and opts.force == ("b", "c")
    assert opts.prefix is None and run_flags_in(argv) == ["--dry-run", "--only", "--force=b", "--force"]
    monkeypatch.setenv("SCHOONER_NO_ARGV", "1")
    assert options_from_argv(["--dry-run"]) is None and run_flags_in(["--dry-run"]) == []


@pytest.mark.slow  # one of the default suite's heaviest (20-70 s on 2 cores); covered in part by faster tests
def test_explain_warns_when_a_reused_step_has_new_code_but_the_same_version(tmp_path) -> None:
    exp = tmp_path / "chain_copy.py"
    exp.write_text(Path(CHAIN).read_text())
    prefix = tmp_path / "out"
    assert schooner("run", str(exp), "--prefix", str(prefix)).returncode == 0
    old_line = '    name = "squares" if config.power == 2 else "cubes"\n'
    assert old_line in exp.read_text()
    exp.write_text(exp.read_text().replace(old_line, old_line.rstrip("\n") + "  # edited\n"))
    text = " ".join(schooner("explain", "squares", str(exp), "--prefix", str(prefix)).stdout.split())
    assert "reused" in text and "the source of" in text and "write_power changed since it ran" in text
    untouched = " ".join(schooner("explain", "numbers", str(exp), "--prefix", str(prefix)).stdout.split())
    assert "reused" in untouched and "changed since it ran" not in untouched


def test_status_name_matches_a_name_with_regex_characters_by_itself(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    # `schooner status --name grid/lr+1e-3`, the name copied from the table, said "no steps found"; a bad
    # regex was a raw re.error traceback.
    from schooner.cluster import StepRunner, step
    from schooner.cluster.cli import main

    prefix = str(tmp_path / "p")
    h = step("grid/lr+1e-3", _status_fn, {"lr": 1e-3})
    assert StepRunner(prefix=prefix, quiet=True).run([h]).ok
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["status", "--prefix", prefix, "--json", "--name", "grid/lr+1e-3"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["grid/lr+1e-3"]
    # a name is that step alone, also where it reads as a regex matching another ('r+' matches 'rr')
    other = step("grid/lrr1e-3", _status_fn, {"lr": 2e-3})
    assert StepRunner(prefix=prefix, quiet=True).run([other]).ok
    assert main(["status", "--prefix", prefix, "--json", "--name", "grid/lr+1e-3"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["grid/lr+1e-3"]
    assert main(["status", "--prefix", prefix, "--name", "grid/(lr"]) == 2
    out = capsys.readouterr()
    assert "--name 'grid/(lr' is not a valid regular expression" in out.out + out.err


def _status_fn(config: dict, output_path: str) -> dict:
    return {"lr": config["lr"]}


def test_explain_with_a_bad_regex_is_an_error_line(tmp_path: Path, capsys) -> None:
    # `schooner explain 'grid/(' exp.py` ended in a raw re.error traceback.
    from schooner.cluster.cli import main

    exp = tmp_path / "exp.py"
    exp.write_text(
        "from schooner.cluster import step\n\n\ndef f(config, output_path):\n    return 1\n\n\n"
        "h = step('grid/lr', f, {'lr': 1})\n"
    )
    assert main(["explain", "--prefix", str(tmp_path / "p"), "grid/(", str(exp)]) == 2
    out = capsys.readouterr()
    text = " ".join((out.out + out.err).split())  # the console may wrap
    assert "'grid/(' is no step name of" in text and "not a valid regular expression" in text
    assert "its steps: grid/lr" in text


def test_an_experiment_that_only_declares_steps_is_recorded_under_its_own_name(tmp_path: Path) -> None:
    # `schooner run exp.py` with module-level handles (no run() call) recorded the run as experiment
    # 'schooner', its script as the `schooner` entry point and the git commit of the folder holding that
    # entry point: every such experiment was 'schooner' in the report, with another repository's commit.
    from schooner.cluster.cli import main

    exp = tmp_path / "my_ablation.py"
    exp.write_text(
        "from schooner.cluster import step\n\n\ndef f(config, output_path):\n    return 1\n\n\n"
        "h = step('abl/one', f, {'n': 1})\n"
    )
    prefix = tmp_path / "p"
    assert main(["run", str(exp), "--prefix", str(prefix), "--quiet"]) == 0
    folders = [p.name for p in (prefix / "experiments").iterdir()]
    assert len(folders) == 1 and folders[0].startswith("my_ablation-"), folders
    (record,) = (prefix / "experiments" / folders[0]).glob("*.json")
    data = json.loads(record.read_text())
    assert data["experiment"] == "my_ablation" and data["env"]["script"] == str(exp)
    assert data["env"]["git"] is None or not data["env"]["git"].get("commit")  # tmp_path is no repository


def test_explain_without_the_experiment_takes_a_regex_as_its_help_says(tmp_path: Path, capsys) -> None:
    # `schooner explain STEP` documents "the step's name (or a regex matching names)"; without the
    # experiment file a regex found nothing ("no recorded step named 'grid/lr'").
    from schooner.cluster import StepRunner, step
    from schooner.cluster.cli import main

    prefix = str(tmp_path / "p")
    runner = StepRunner(prefix=prefix, quiet=True)
    for lr in (1e-3, 2e-3):
        assert runner.run([step("grid/lr+1e-3", _status_fn, {"lr": lr})]).ok
    assert runner.run([step("other/x", _status_fn, {"lr": 1})]).ok
    assert main(["explain", "--prefix", prefix, "^grid/lr"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("grid/lr+1e-3 [") and "config.lr: 0.001 -> 0.002" in out and "other/x" not in out
    assert main(["explain", "--prefix", prefix, "^nothing"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "no recorded step named '^nothing'" in out and "grid/lr+1e-3, other/x" in out


def test_explain_given_only_the_experiment_file_says_the_step_comes_first(tmp_path: Path, capsys) -> None:
    # A new user's `schooner explain exp.py` said "no recorded step named '.../exp.py' ...; pass the experiment
    # file", which they had, with exit status 1.
    from schooner.cluster.cli import main

    exp = tmp_path / "exp.py"
    exp.write_text(
        "from schooner.cluster import step\n\n\ndef f(config, output_path):\n    return 1\n\n\nh = step('a', f, {})\n"
    )
    assert main(["explain", "--prefix", str(tmp_path / "p"), str(exp)]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "is an experiment file, and the first argument is the step" in out
        and f"schooner explain . {exp}" in out
    )


def test_a_bad_step_name_in_an_experiment_is_an_error_line_not_a_traceback(tmp_path) -> None:
    """A step name with a space is a bad experiment like any other: one error line naming the character and the
    experiment's line, exit status 2 (it was a ValueError traceback with status 1)."""
    out = _run_a_bad_experiment(
        tmp_path,
        "from schooner.cluster import StepRunner, step\n\n"
        "def f(config, output_path):\n    return {}\n\n"
        's = step("exp/bad name", f, {"a": 1})\n'
        'if __name__ == "__main__":\n    StepRunner().main([s])\n',
    )
    assert "Traceback" not in out, out
    assert "step name 'exp/bad name' is not valid" in out and "(at exp.py:6)" in out, out


@pytest.mark.parametrize("command", ["run", "run --dry-run", "explain"])
def test_an_error_in_the_experiment_file_shows_its_frames_not_the_clis(tmp_path, command: str) -> None:
    """An exception the experiment's own code raises (a knob's ValueError) came with ~25 lines of the CLI's and
    runpy's frames before the file's; now the traceback starts at the file, as `python exp.py` shows it, and the
    exit status is 2 (a bad experiment). Every command that loads the file (`explain` showed all the frames)."""
    exp = tmp_path / "exp.py"
    out = _run_a_bad_experiment(
        tmp_path,
        "import os\n\n"
        "def knob(name):\n"
        "    value = int(os.environ.get(name, '-1'))\n"
        "    if value < 0:\n"
        "        raise ValueError(f'{name} must be >= 0, got {value}')\n"
        "    return value\n\n"
        "STEPS = knob('EXP_STEPS')\n",
        command,
    )
    assert (
        "Traceback (most recent call last)" in out and "ValueError: EXP_STEPS must be >= 0, got -1" in out
    ), out
    assert f'File "{exp}", line 9' in out and f'File "{exp}", line 6' in out, out
    assert "runpy" not in out and "schooner/cluster/cli" not in out, out


def _run_a_bad_experiment(tmp_path: Path, source: str, command: str = "run") -> str:
    """`schooner run` (or `command`: "run --dry-run", "explain") of an experiment file `exp.py` holding
    `source`: its output, the exit status 2 checked."""
    exp = tmp_path / "exp.py"
    exp.write_text(source)
    name, *flags = command.split()
    where = [str(exp)] if name == "run" else ["some/step", str(exp)]  # explain STEP EXP.py
    done = schooner(name, *where, "--prefix", str(tmp_path / "out"), *flags)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    return out
