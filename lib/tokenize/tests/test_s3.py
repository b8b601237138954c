"""Token caches on an object store: a real S3 API server (moto, its own process) as the prefix, files
through fsspec and token arrays through tensorstore's S3 driver, both at the server's endpoint."""

from __future__ import annotations

import numpy as np

from schooner.cluster import StepRunner
from schooner.data import make_record, write_records
from schooner.tokenize import MixtureDataset, TokenCache, build_cache
from schooner.tokenize.steps import tokenized

from .conftest import stdlib_texts


def test_a_token_cache_built_on_s3_equals_the_local_one(
    s3_prefix: str, tokenizer, tokenizer_path, tmp_path
) -> None:
    records = str(tmp_path / "recs")
    write_records([make_record(t, source="stdlib") for t in stdlib_texts(12)], records, num_shards=3)
    build_cache([records], str(tmp_path / "local"), tokenizer, validation_fraction=0.0)
    build_cache([records], f"{s3_prefix}/cache", tokenizer, validation_fraction=0.0)
    local = TokenCache.open(str(tmp_path / "local" / "train"), tokenizer=tokenizer)
    remote = TokenCache.open(f"{s3_prefix}/cache/train", tokenizer=tokenizer)
    assert remote.num_documents == local.num_documents == 12
    for i in (0, 5, 11):
        np.testing.assert_array_equal(remote.document(i), local.document(i))
    # The tokenized step on an s3:// prefix, and a mixture reading its cache.
    h = tokenized("tokenized/s3", paths=[records], tokenizer=tokenizer_path, validation_fraction=0.0)
    result = StepRunner(prefix=s3_prefix, quiet=True).run([h])
    batch = MixtureDataset({result[h].output_path: 1.0}, seq_len=32, seed=0).batch(0, 2)
    assert batch["tokens"].shape == (2, 32)
