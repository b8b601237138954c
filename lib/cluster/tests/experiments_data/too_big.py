"""numbers (in process) -> huge (asks for 64 CPUs): the plan must refuse before `numbers` runs."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chain import PowerConfig, numbers, write_power  # noqa: E402

from schooner.cluster import ResourceConfig, StepRunner, step  # noqa: E402

huge = step("huge", write_power, PowerConfig(numbers=numbers, power=2), resources=ResourceConfig.with_cpu(64))

if __name__ == "__main__":
    StepRunner().main([huge])
