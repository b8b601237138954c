"""A run's train.log holds its own lines only, when several runs train at once in one process (the step
runner's in-process steps run as threads: the v5e Delphi suite's three concurrent runs each found all three
runs' lines in their train.log)."""

import logging
import os
import threading

from schooner.train._checkpoint import CheckpointConfig, CheckpointManager
from schooner.train._run_info import RunLog, logger


def _write_tag(path: str, snap: dict) -> None:
    with open(f"{path}/x", "w") as f:
        f.write(snap["tag"])


def _run(folder: str, tag: str, ready: threading.Barrier, errors: list[BaseException]) -> None:
    try:
        logs = RunLog(folder)
        try:
            ready.wait(timeout=30)  # both runs' logs are open before either writes
            ckpt = CheckpointManager(
                f"{folder}/checkpoints", CheckpointConfig(every=1, asynchronous=True), log=logger.info
            )
            for step in range(20):
                logger.info("run %s step %d", tag, step)
                if step % 5 == 4:  # written on the manager's background thread, which logs when done
                    ckpt.save(step, {"tag": tag}, _write_tag, {})
            ckpt.wait()
            ready.wait(timeout=30)  # neither closes its log while the other still writes
        finally:
            logs.close()
    except BaseException as e:
        errors.append(e)


def test_concurrent_runs_write_only_their_own_lines(tmp_path):
    folders = {tag: str(tmp_path / tag) for tag in "AB"}
    for f in folders.values():
        os.makedirs(f)
    ready, errors = threading.Barrier(2), []
    threads = [threading.Thread(target=_run, args=(f, tag, ready, errors)) for tag, f in folders.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    for tag, folder in folders.items():
        other = "B" if tag == "A" else "A"
        with open(f"{folder}/train.log") as f:
            text = f.read()
        assert text.count(f"run {tag} step") == 20, text
        assert f"run {other} step" not in text, f"{tag}'s train.log holds run {other}'s lines"
        # the checkpoint thread's lines follow the run that started it: 4 saves each
        assert text.count("written in") == 4, text


def test_a_line_from_outside_any_run_goes_to_every_open_log(tmp_path):
    """A line no run emitted (e.g. a user's code on the main thread) is not dropped: each open log gets it."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    opened: list[RunLog] = []
    done = threading.Event()

    def open_in_thread(folder):
        opened.append(RunLog(str(folder)))
        done.wait(timeout=30)

    threads = [threading.Thread(target=open_in_thread, args=(f,)) for f in (a, b)]
    for t in threads:
        t.start()
    while len(opened) < 2:
        threading.Event().wait(0.01)
    logger.info("a line from outside")
    done.set()
    for t in threads:
        t.join()
    for log in opened:
        log.close()
    for folder in (a, b):
        assert "a line from outside" in (folder / "train.log").read_text()


def test_one_run_on_the_calling_thread_still_logs_everything(tmp_path):
    logs = RunLog(str(tmp_path))
    ckpt = CheckpointManager(
        str(tmp_path / "c"), CheckpointConfig(every=1, asynchronous=True), log=logger.info
    )
    logger.info("plain line")
    ckpt.save(0, {}, lambda path, snap: None, {})
    ckpt.wait()
    logs.close()
    logging.getLogger("schooner.train").info("after close")  # no longer in the file
    text = (tmp_path / "train.log").read_text()
    assert "plain line" in text and "written in" in text and "after close" not in text


def test_a_run_that_ends_first_leaves_the_others_logging(tmp_path, monkeypatch):
    """The logger's level and the stderr handler are shared: the first run to close must not take them from
    a run still training (its INFO lines would stop reaching its train.log)."""
    monkeypatch.setattr(logger, "level", logging.NOTSET)  # as under StepRunner: root at WARNING, no handlers
    monkeypatch.setattr(logging.getLogger(), "level", logging.WARNING)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    a_open, a_closed = threading.Event(), threading.Event()

    def run_a():
        log = RunLog(str(a))
        a_open.set()
        logger.info("A's line")
        log.close()
        a_closed.set()

    def run_b():
        a_open.wait(timeout=30)
        log = RunLog(str(b))
        a_closed.wait(timeout=30)
        logger.info("B's line after A closed")
        log.close()

    threads = [threading.Thread(target=run_a), threading.Thread(target=run_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert "A's line" in (a / "train.log").read_text()
    assert "B's line after A closed" in (b / "train.log").read_text()
    assert logger.getEffectiveLevel() == logging.WARNING  # restored once the last run closed
