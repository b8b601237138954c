"""ResourceConfig: validation names the field, the value and the allowed values; sizes parse; env stays secret."""

from __future__ import annotations

import dataclasses

import pytest

from schooner.cluster import ResourceConfig
from schooner.cluster._resources import GPU_KINDS


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cpu": -1}, "cpu must be a finite number >= 0, got cpu=-1"),
        ({"cpu": True}, "cpu must be a finite number"),
        ({"cpu": float("nan")}, "cpu must be a finite number >= 0, got cpu=nan"),
        ({"cpu": float("inf")}, "cpu must be a finite number >= 0, got cpu=inf"),
        ({"ram": float("nan")}, "ram must be a finite size, got nan"),
        ({"ram": float("inf")}, "ram must be a finite size, got inf"),
        ({"ram": "4ib"}, "ram: cannot parse size '4ib'"),
        ({"disk": "2xb"}, "disk: cannot parse size '2xb'"),
        (
            {"device_count": -2, "device": "gpu", "device_kind": "H100"},
            "device_count must be an integer >= 0",
        ),
        (
            {"max_retries_failure": -1},
            "max_retries_failure must be an integer >= 0, got max_retries_failure=-1",
        ),
        ({"max_retries_preemption": 1.5}, "max_retries_preemption must be an integer"),
        ({"slices": -1}, "slices must be an integer >= 0"),
        ({"ram": -5}, "ram must be >= 0"),
        ({"ram": "lots"}, "cannot parse size 'lots'"),
        ({"disk": "12 parsecs"}, "disk: cannot parse size"),
        ({"device": "fpga"}, "device must be one of 'cpu', 'gpu', 'tpu', got device='fpga'"),
        ({"device_kind": "H100"}, "device='cpu' takes no device_kind"),
    ],
)
def test_invalid_values_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        ResourceConfig(**kwargs)


def test_unknown_gpu_kind_lists_the_allowed_ones():
    with pytest.raises(ValueError) as info:
        ResourceConfig.with_gpu("GTX1080")
    text = str(info.value)
    assert "device_kind='GTX1080'" in text
    assert all(kind in text for kind in GPU_KINDS)


def test_unknown_tpu_kind_lists_the_allowed_ones():
    with pytest.raises(ValueError, match=r"device_kind='v9-8' is not a TPU kind; allowed: v2-N.*v6e-N"):
        ResourceConfig.with_tpu("v9-8")
    with pytest.raises(ValueError, match="slices must be >= 1"):
        ResourceConfig.with_tpu("v5p-8", slices=0)


def test_gpu_job_needs_at_least_one_gpu():
    with pytest.raises(ValueError, match="device_count must be >= 1 for a GPU job, got 0"):
        ResourceConfig.with_gpu("H100", count=0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4GiB", 4 * 2**30),
        ("512MB", 512 * 10**6),
        ("1.5g", int(1.5e9)),
        ("100", 100),
        (2048, 2048),
        ("2 KiB", 2048),
    ],
)
def test_sizes_parse(text, expected):
    assert ResourceConfig(ram=text).ram == expected


@pytest.mark.parametrize(
    ("kind", "chips"), [("v5p-8", 4), ("v4-32", 16), ("v5e-16", 16), ("v6e-8", 8), ("v2-8", 4)]
)
def test_tpu_chips_follow_the_naming_of_each_generation(kind, chips):
    assert ResourceConfig.with_tpu(kind).tpu_chips == chips


def test_builders_and_defaults():
    cpu = ResourceConfig.with_cpu()
    assert (cpu.cpu, cpu.device, cpu.ram, cpu.max_retries_failure, cpu.max_retries_preemption) == (
        1.0,
        "cpu",
        None,
        0,
        3,
    )
    gpu = ResourceConfig.with_gpu("A100-80G", count=4, cpu=8, ram="64GiB")
    assert (gpu.device, gpu.device_kind, gpu.device_count, gpu.cpu, gpu.ram) == (
        "gpu",
        "A100-80G",
        4,
        8.0,
        64 * 2**30,
    )
    assert gpu.tpu_chips == 0
    assert ResourceConfig.with_tpu("v5p-8", slices=2).slices == 2


def test_frozen_and_replace():
    res = ResourceConfig.with_cpu()
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.cpu = 4  # type: ignore[misc]
    assert res.replace(cpu=4).cpu == 4.0
    with pytest.raises(ValueError, match="cpu must be"):
        res.replace(cpu=-4)


def test_env_must_be_strings_and_secrets_stay_out_of_repr_and_errors():
    with pytest.raises(ValueError, match=r"env must map str to str, got \{'HF_TOKEN': '\*\*\*'"):
        ResourceConfig(env={"HF_TOKEN": "hf_abcdefgh", "N": 3})
    res = ResourceConfig.with_cpu(env={"WANDB_API_KEY": "0123456789abcdef", "COLOUR": "teal"})
    assert "0123456789abcdef" not in repr(res)
    assert "'COLOUR': 'teal'" in repr(res)
    assert res.env["WANDB_API_KEY"] == "0123456789abcdef"  # the job still gets the value
