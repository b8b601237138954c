"""A helper module that runs steps for an experiment (the flags of the command line never reach it)."""

from schooner.cluster import StepRunner


def run_all(steps: list) -> None:
    StepRunner().run(steps)
