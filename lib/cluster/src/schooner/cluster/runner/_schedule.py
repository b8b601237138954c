"""Running the steps of a plan concurrently, each as soon as its inputs are done.

At most `max_concurrent` steps run at once (threads calling `StepExecutor.execute`); a step that does not
succeed skips every step downstream of it ("input X failed"), and the others go on.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from ._lower import Step
from ._results import StepOutcome
from ._step_exec import StepExecutor


def schedule(
    todo: list[Step],
    by_key: dict[str, Step],
    outcomes: dict[str, StepOutcome],
    executor: StepExecutor,
    max_concurrent: int,
) -> None:
    """Run `todo` (in dependency order, `max_concurrent` at a time) through `executor`, filling `outcomes`."""
    waiting_on = {s.key: {d for d in s.deps if d in by_key and d not in outcomes} for s in todo}
    dependents: dict[str, list[str]] = {}
    for s in todo:
        for d in waiting_on[s.key]:
            dependents.setdefault(d, []).append(s.key)
    ready = [s.key for s in todo if not waiting_on[s.key]]
    running: dict[Future[StepOutcome], str] = {}
    pool = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="schooner-step")
    try:
        while ready or running:
            while ready and len(running) < max_concurrent:
                key = ready.pop(0)
                running[pool.submit(executor.execute, by_key[key])] = key
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in done:
                key = running.pop(fut)
                outcome = fut.result()
                outcomes[key] = outcome
                if outcome.ok:
                    for dep in dependents.get(key, []):
                        waiting_on[dep].discard(key)
                        if not waiting_on[dep] and dep not in outcomes:
                            ready.append(dep)
                else:
                    _skip_dependents(key, by_key, dependents, outcomes, executor)
    except BaseException:
        # Ctrl-C (or an internal error): nothing new starts; `StepRunner._run` stops what runs and records it.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _skip_dependents(
    failed_key: str,
    by_key: dict[str, Step],
    dependents: dict[str, list[str]],
    outcomes: dict[str, StepOutcome],
    executor: StepExecutor,
) -> None:
    failed = by_key[failed_key]
    stack = list(dependents.get(failed_key, []))
    while stack:
        key = stack.pop()
        if key in outcomes:
            continue
        s = by_key[key]
        outcomes[key] = StepOutcome(
            s.name, key, executor.paths[key], "skipped", error=f"input {failed.name!r} failed"
        )
        executor.progress.finished(outcomes[key])
        stack.extend(dependents.get(key, []))
