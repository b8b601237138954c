import os

import numpy as np
import pytest

from schooner.cluster import LocalClient
from schooner.cluster.pytest_fixtures import ray_client as ray_client
from schooner.data import make_record, write_records
from schooner.tokenize import TokenCache, build_cache

from .conftest import stdlib_texts


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_ray_and_local_clients_build_identical_caches(ray_client, tokenizer_path: str, tmp_path) -> None:
    src = str(tmp_path / "recs")
    write_records([make_record(t, source="stdlib") for t in stdlib_texts(24, start=5)], src, num_shards=4)
    on_ray, on_local = str(tmp_path / "ray"), str(tmp_path / "local")
    build_cache(src, on_ray, tokenizer_path, validation_fraction=0.2, client=ray_client, in_process_below=0)
    local = LocalClient(max_workers=2)
    try:
        build_cache(src, on_local, tokenizer_path, validation_fraction=0.2, client=local, in_process_below=0)
    finally:
        local.shutdown()
    for split in ("train", "validation"):
        a, b = TokenCache.open(os.path.join(on_ray, split)), TokenCache.open(os.path.join(on_local, split))
        assert a.num_documents > 0
        assert a.manifest == b.manifest
        assert np.array_equal(a.tokens(0, a.num_tokens), b.tokens(0, b.num_tokens))
        assert np.array_equal(a.offsets(), b.offsets())
