"""An experiment that only declares steps (no __main__ block): `schooner run` runs them all."""

import os

from schooner.cluster import step


def hello(config, out):
    with open(os.path.join(out, "hello.txt"), "w") as f:
        f.write(config["greeting"])
    return config["greeting"]


greet = step("greet", hello, {"greeting": "hello"})
