import threading

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from schooner.tokenize import DataLoader, MixtureDataset, Tokenizer, write_cache


@pytest.fixture(scope="module")
def dataset(tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> MixtureDataset:
    rng = np.random.default_rng(1)
    path = str(tmp_path_factory.mktemp("loader") / "c")
    write_cache(path, [rng.integers(10, 700, size=int(rng.integers(3, 40))) for _ in range(200)], tokenizer)
    return MixtureDataset({path: 1.0}, seq_len=16, seed=0, block_size=64)


def test_places_batches_per_sharding(dataset: MixtureDataset) -> None:
    mesh = jax.make_mesh((8,), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data", None))
    with DataLoader(dataset, 16, sharding=sharding, stop_step=3) as loader:
        got = list(loader)
    assert [s for s, _ in got] == [0, 1, 2]
    for step, batch in got:
        assert isinstance(batch["tokens"], jax.Array)
        assert batch["tokens"].sharding == sharding and batch["segment_ids"].sharding == sharding
        assert len(batch["tokens"].addressable_shards) == 8
        assert batch["tokens"].addressable_shards[0].data.shape == (2, 16)
        assert np.array_equal(np.asarray(batch["tokens"]), dataset.batch(step, 16)["tokens"])


def test_prefetches_in_order_on_threads(dataset: MixtureDataset) -> None:
    threads = set()

    class Recording:
        def batch(self, step, batch_size):
            threads.add(threading.current_thread().name)
            return dataset.batch(step, batch_size)

    loader = DataLoader(Recording(), 4, start_step=7, prefetch=3)
    it = iter(loader)
    steps = [next(it)[0] for _ in range(6)]
    it.close()
    assert steps == list(range(7, 13))
    assert threads and all(t.startswith("schooner-loader") for t in threads)


def test_failure_surfaces_at_its_step(dataset: MixtureDataset) -> None:
    class Failing:
        def batch(self, step, batch_size):
            if step == 2:
                raise RuntimeError("boom at 2")
            return dataset.batch(step, batch_size)

    it = iter(DataLoader(Failing(), 4))
    assert next(it)[0] == 0 and next(it)[0] == 1
    with pytest.raises(RuntimeError, match="boom at 2"):
        next(it)


def test_bad_arguments(dataset: MixtureDataset) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(dataset, 0)
    with pytest.raises(ValueError, match="prefetch"):
        DataLoader(dataset, 4, prefetch=0)
    with pytest.raises(ValueError, match="stop_step=1 is before start_step=2"):
        DataLoader(dataset, 4, start_step=2, stop_step=1)


def test_rows_subset_equals_the_full_batch_rows(dataset: MixtureDataset) -> None:
    full = dataset.batch(5, 16)
    rows = np.array([15, 3, 4, 0])
    part = dataset.batch(5, 16, rows=rows)
    for k in ("tokens", "segment_ids"):
        assert np.array_equal(part[k], full[k][rows])
    with pytest.raises(IndexError, match="outside batch 5"):
        dataset.batch(5, 16, rows=np.array([16]))


@pytest.mark.parametrize("spec", [("data", None), ("data", "model"), (None, "model")])
def test_host_local_assembly_equals_the_global_batch(dataset: MixtureDataset, spec) -> None:
    # The multi-host path (each process builds only its devices' rows), taken on one host.
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    sharding = NamedSharding(mesh, PartitionSpec(*spec))
    with DataLoader(dataset, 8, sharding=sharding, stop_step=2, host_local=True) as loader:
        for step, batch in loader:
            assert batch["tokens"].sharding == sharding
            for k in ("tokens", "segment_ids"):
                assert np.array_equal(np.asarray(batch[k]), dataset.batch(step, 8)[k])


def test_host_local_needs_a_dataset_with_seq_len(dataset: MixtureDataset) -> None:
    class NoRows:  # a batch(step, batch_size) source: enough on one host, not for per-host rows
        def batch(self, step, batch_size):
            return dataset.batch(step, batch_size)

    sharding = NamedSharding(jax.make_mesh((8,), ("data",)), PartitionSpec("data", None))
    with pytest.raises(TypeError, match=r"NoRows has no `seq_len`.*host_local=True"):
        next(iter(DataLoader(NoRows(), 8, sharding=sharding, host_local=True)))
