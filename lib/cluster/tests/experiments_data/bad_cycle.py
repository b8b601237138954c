"""A bad experiment: a config mutated after step() so that the step depends on itself."""

from schooner.cluster import StepRunner, step


def noop(config, out):
    return None


config = {"rounds": 2}
loop = step("loop", noop, config)
config["previous"] = loop  # the step now names itself as its input

if __name__ == "__main__":
    StepRunner().run([loop])
