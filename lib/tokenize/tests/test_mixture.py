import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schooner.tokenize import (
    CacheError,
    DataLoader,
    MixtureDataset,
    MixtureError,
    TokenCache,
    Tokenizer,
    TokenizerMismatchError,
    train_bpe,
    write_cache,
)


def _docs(rng: np.random.Generator, n_docs: int, lo: int, hi: int, eos: int, vocab: int) -> list[np.ndarray]:
    out = []
    for _ in range(n_docs):
        d = rng.integers(10, vocab, size=int(rng.integers(lo, hi)))
        out.append(d[d != eos])
    return out


@pytest.fixture(scope="module")
def caches(tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("caches")
    rng = np.random.default_rng(0)
    out = {}
    for name, n_docs in (("a", 300), ("b", 120), ("c", 40)):
        path = str(root / name)
        write_cache(path, _docs(rng, n_docs, 5, 60, tokenizer.eos_id, tokenizer.vocab_size), tokenizer)
        out[name] = path
    return out


def test_batch_rows_are_the_cache_windows_with_eos_segments(
    caches: dict[str, str], tokenizer: Tokenizer
) -> None:
    ds = MixtureDataset({caches["a"]: 0.6, caches["b"]: 0.4}, seq_len=32, seed=3, block_size=64)
    b = ds.batch(7, 16)
    assert b["tokens"].shape == (16, 32) and b["tokens"].dtype == np.int32
    assert b["segment_ids"].shape == (16, 32) and b["segment_ids"].dtype == np.int32
    comp, _, seq = ds.sequence_ids(7, 16)
    for row in range(16):
        cache = TokenCache.open([caches["a"], caches["b"]][comp[row]])
        expect = cache.tokens(int(seq[row]) * 32, int(seq[row]) * 32 + 32)
        assert np.array_equal(b["tokens"][row], expect)
        # segment ids by hand: start at 0, +1 right after every EOS
        seg, s = [], 0
        for t in expect:
            seg.append(s)
            s += int(t == tokenizer.eos_id)
        assert b["segment_ids"][row].tolist() == seg
    assert (b["segment_ids"].max(axis=1) > 0).any()  # documents are short: rows hold several


def test_batches_are_pure_and_resume_replays_nothing(caches: dict[str, str]) -> None:
    mk = lambda: MixtureDataset({caches["a"]: 1.0, caches["b"]: 1.0}, seq_len=16, seed=11, block_size=32)  # noqa: E731
    straight = [b for _, b in DataLoader(mk(), 8, stop_step=12)]
    resumed = [b for _, b in DataLoader(mk(), 8, start_step=5, stop_step=12)]
    for s in range(5, 12):
        for k in ("tokens", "segment_ids"):
            assert np.array_equal(straight[s][k], resumed[s - 5][k])
    # reverse order, fresh object: the same batch
    assert np.array_equal(mk().batch(9, 8)["tokens"], straight[9]["tokens"])
    other_seed = MixtureDataset({caches["a"]: 1.0, caches["b"]: 1.0}, seq_len=16, seed=12, block_size=32)
    assert not np.array_equal(other_seed.batch(9, 8)["tokens"], straight[9]["tokens"])


_CHILD = """
import hashlib, sys
from schooner.tokenize import MixtureDataset
ds = MixtureDataset({sys.argv[1]: 0.7, sys.argv[2]: 0.3}, seq_len=24, seed=5, block_size=50)
h = hashlib.sha256()
for step in (0, 3, 40, 41):
    b = ds.batch(step, 12)
    h.update(b["tokens"].tobytes()); h.update(b["segment_ids"].tobytes())
print(h.hexdigest())
"""


def test_batches_identical_across_processes(caches: dict[str, str]) -> None:
    ds = MixtureDataset({caches["a"]: 0.7, caches["b"]: 0.3}, seq_len=24, seed=5, block_size=50)
    h = hashlib.sha256()
    for step in (0, 3, 40, 41):
        b = ds.batch(step, 12)
        h.update(b["tokens"].tobytes())
        h.update(b["segment_ids"].tobytes())
    env = {**os.environ, "PYTHONHASHSEED": "999"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, caches["a"], caches["b"]],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert out.stdout.strip() == h.hexdigest()


@settings(max_examples=25, deadline=None)
@given(
    weights=st.lists(st.floats(0.05, 10.0), min_size=2, max_size=3),
    block_size=st.integers(20, 200),
    seed=st.integers(0, 2**32),
)
def test_exact_counts_per_block_and_bounded_deviation(caches, weights, block_size, seed) -> None:
    paths = [caches["a"], caches["b"], caches["c"]][: len(weights)]
    w = np.array(weights) / np.sum(weights)
    if (w * block_size < 1).any():
        return  # such a mixture is rejected (tested elsewhere)
    ds = MixtureDataset(dict(zip(paths, weights)), seq_len=8, seed=seed, block_size=block_size)
    bs = block_size  # one step per block
    counts = [np.bincount(ds.sequence_ids(step, bs)[0], minlength=len(paths)) for step in range(3)]
    # Every block holds the same exact counts: each is its weight's share rounded down or up, and they fill
    # the block (expectations from the weights alone, not from the code's own rounding).
    share = w * block_size
    for c in counts:
        assert c.tolist() == counts[0].tolist()
        assert c.sum() == block_size
        assert np.all(c >= np.floor(share - 1e-9)) and np.all(c <= np.ceil(share + 1e-9))
    # any window of a block: a random sample without replacement of its slots (hypergeometric bound)
    window = max(1, block_size // 4)
    comp, _, _ = ds.sequence_ids(1, window)
    for c in range(len(paths)):
        p = counts[0][c] / block_size
        sd = np.sqrt(window * p * (1 - p) * (block_size - window) / max(1, block_size - 1))
        assert abs((comp == c).sum() - window * p) <= 5 * sd + 1


def test_proportions_over_many_steps_match_weights(caches: dict[str, str]) -> None:
    ds = MixtureDataset(
        {caches["a"]: 0.5, caches["b"]: 0.3, caches["c"]: 0.2}, seq_len=8, seed=0, block_size=100
    )
    comps = np.concatenate([ds.sequence_ids(s, 37)[0] for s in range(100)])  # 3700 draws, not block-aligned
    freq = np.bincount(comps, minlength=3) / comps.size
    # exact per block: only the last partial block can deviate, by at most block_size draws
    assert np.all(np.abs(freq - [0.5, 0.3, 0.2]) <= 100 / comps.size)


def test_epochs_restart_with_new_permutation_and_are_counted(caches: dict[str, str]) -> None:
    ds = MixtureDataset({caches["c"]: 1.0}, seq_len=16, seed=2, block_size=16)
    n = len(ds.sequences[0])
    assert n > 10
    seqs, epochs = [], []
    for step in range(3 * n // 4 + 2):
        _, e, s = ds.sequence_ids(step, 4)
        seqs.extend(s.tolist())
        epochs.extend(e.tolist())
    seqs, epochs = np.array(seqs), np.array(epochs)
    first, second = seqs[epochs == 0], seqs[epochs == 1]
    assert sorted(first.tolist()) == list(range(n))  # each sequence exactly once per epoch
    assert sorted(second.tolist()) == list(range(n))
    assert not np.array_equal(first, second)  # a new order each epoch
    assert not np.array_equal(first, np.arange(n))
    total = 4 * (3 * n // 4 + 2)
    assert ds.epochs_at(3 * n // 4 + 1, 4) == {caches["c"]: pytest.approx(total / n)}


def test_weight_schedule_switches_components(caches: dict[str, str]) -> None:
    ds = MixtureDataset(
        {caches["a"]: 1.0, caches["b"]: 0.0},
        seq_len=8,
        seed=0,
        block_size=16,
        weight_schedule=[
            (10, {caches["a"]: 0.0, caches["b"]: 1.0}),
            (20, {caches["a"]: 1.0, caches["b"]: 1.0}),
        ],
    )
    assert set(ds.sequence_ids(9, 16)[0].tolist()) == {0}
    assert set(ds.sequence_ids(10, 16)[0].tolist()) == {1}
    assert np.bincount(ds.sequence_ids(25, 16)[0]).tolist() == [8, 8]
    assert ds.weights_at(15) == {caches["a"]: 0.0, caches["b"]: 1.0}
    # draws of b continue across stages: steps 10..19 used b's sequences 0..159 in epoch order
    e = ds.epochs_at(19, 16)
    assert e[caches["b"]] == pytest.approx(160 / len(ds.sequences[1]))
    assert e[caches["a"]] == pytest.approx(160 / len(ds.sequences[0]))


def test_callable_batch_size(caches: dict[str, str]) -> None:
    ds = MixtureDataset({caches["a"]: 1.0}, seq_len=8, seed=0, block_size=16)
    sizes = lambda step: 4 if step < 3 else 8  # noqa: E731
    rows = np.concatenate([ds.sequence_ids(s, sizes)[2] for s in range(5)])
    const = np.concatenate([ds.sequence_ids(s, 4)[2] for s in range(7)])
    assert np.array_equal(rows, const[: rows.size])  # the same stream, cut differently
    assert ds.batch(4, sizes)["tokens"].shape == (8, 8)


def test_bad_weights_and_schedule(caches: dict[str, str]) -> None:
    with pytest.raises(MixtureError, match=r"component '.*/a' has weight -0.5"):
        MixtureDataset({caches["a"]: -0.5, caches["b"]: 1.0}, seq_len=8)
    with pytest.raises(MixtureError, match="weights sum to zero"):
        MixtureDataset({caches["a"]: 0.0, caches["b"]: 0.0}, seq_len=8)
    with pytest.raises(MixtureError, match="weight nan"):
        MixtureDataset({caches["a"]: float("nan")}, seq_len=8)
    with pytest.raises(MixtureError, match=r"weight_schedule\[0\] \(step 5\): weights sum to zero"):
        MixtureDataset({caches["a"]: 1.0}, seq_len=8, weight_schedule=[(5, {caches["a"]: 0.0})])
    with pytest.raises(MixtureError, match="unknown components"):
        MixtureDataset({caches["a"]: 1.0}, seq_len=8, weight_schedule=[(5, {"/elsewhere": 1.0})])
    with pytest.raises(MixtureError, match="ascending"):
        MixtureDataset(
            {caches["a"]: 1.0}, seq_len=8, weight_schedule=[(5, {caches["a"]: 1.0}), (5, {caches["a"]: 1.0})]
        )
    with pytest.raises(MixtureError, match="get 0 of block_size=16"):
        MixtureDataset({caches["a"]: 1000.0, caches["b"]: 1.0}, seq_len=8, block_size=16).batch(0, 4)


def test_seq_len_longer_than_component(caches: dict[str, str]) -> None:
    n = TokenCache.open(caches["c"]).num_tokens
    with pytest.raises(
        MixtureError, match=rf"seq_len={n + 1} is longer than component '.*/c' .* only {n} tokens"
    ):
        MixtureDataset({caches["a"]: 1.0, caches["c"]: 1.0}, seq_len=n + 1)


def test_empty_component(caches: dict[str, str], tokenizer: Tokenizer, tmp_path: Path) -> None:
    empty = str(tmp_path / "empty")
    write_cache(empty, [], tokenizer)
    with pytest.raises(MixtureError, match=r"component '.*empty' \(cache .*\) is empty: 0 documents"):
        MixtureDataset({caches["a"]: 1.0, empty: 0.5}, seq_len=8)


def test_tokenizer_mismatch_and_vocab(caches: dict[str, str], tokenizer: Tokenizer, tmp_path: Path) -> None:
    other = train_bpe(["completely different text " * 50], vocab_size=300)
    alien = str(tmp_path / "alien")
    write_cache(alien, [[20, 30, 40] * 10], other)
    with pytest.raises(MixtureError, match=r"component '.*alien' \(cache .*\) was built with tokenizer"):
        MixtureDataset({caches["a"]: 1.0, alien: 1.0}, seq_len=8)
    both = rf"\(fingerprint {tokenizer.fingerprint}\) but is read with tokenizer .*\(fingerprint {other.fingerprint}\)"
    with pytest.raises(
        TokenizerMismatchError, match=rf"token cache '.*/a' was built with tokenizer .*{both}"
    ):
        MixtureDataset({caches["a"]: 1.0}, seq_len=8, tokenizer=other)
    fp_only = rf"\(fingerprint {tokenizer.fingerprint}\) but is read with tokenizer fingerprint {other.fingerprint};"
    with pytest.raises(TokenizerMismatchError, match=rf"token cache '.*/a' .*{fp_only}"):
        MixtureDataset({caches["a"]: 1.0, caches["b"]: 1.0}, seq_len=8).check_tokenizer(other.fingerprint)
    ds = MixtureDataset({caches["a"]: 1.0}, seq_len=8, tokenizer=tokenizer)  # the right one passes
    assert ds.tokenizer_fingerprint == tokenizer.fingerprint
    ds.check_tokenizer(tokenizer)
    with pytest.raises(CacheError, match=r"token cache '.*/a': token id \d+ is beyond vocab_size=100"):
        MixtureDataset({caches["a"]: 1.0}, seq_len=8, vocab_size=100)


def test_cache_reader_bounds_and_missing(caches: dict[str, str], tmp_path: Path) -> None:
    cache = TokenCache.open(caches["b"])
    assert cache.offsets()[-1] == cache.num_tokens and cache.offsets().size == cache.num_documents + 1
    assert cache.document(-1)[-1] == cache.eos_id
    with pytest.raises(IndexError, match="document 120 is outside"):
        cache.document(120)
    with pytest.raises(IndexError, match="token range"):
        cache.tokens(0, cache.num_tokens + 1)
    with pytest.raises(CacheError, match="no manifest.json"):
        TokenCache.open(tmp_path)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    batch_size=st.integers(1, 40),
    steps=st.integers(1, 40),
    switch=st.integers(1, 40),
    w=st.floats(0.1, 0.9),
)
def test_draws_never_repeat_within_an_epoch_and_epochs_are_counted(
    caches, seed, batch_size, steps, switch, w
) -> None:
    a, b = caches["b"], caches["c"]  # small components, so epochs wrap
    ds = MixtureDataset(
        {a: w, b: 1 - w}, seq_len=16, seed=seed, block_size=32, weight_schedule=[(switch, {a: 1 - w, b: w})]
    )
    rows = [ds.sequence_ids(s, batch_size) for s in range(steps)]
    comp = np.concatenate([r[0] for r in rows])
    epoch = np.concatenate([r[1] for r in rows])
    seq = np.concatenate([r[2] for r in rows])
    full = (
        comp.size // 32 * 32
    )  # rows of complete blocks (a partial block draws a random subset of its slots)
    for c, path in enumerate((a, b)):
        n = len(ds.sequences[c])
        pairs = list(zip(epoch[comp == c].tolist(), seq[comp == c].tolist()))
        assert len(set(pairs)) == len(pairs)  # no sequence twice in one epoch
        # complete blocks draw exactly the first k of the component's stream: full epochs, then a partial one
        in_full = [e for e, cc in zip(epoch[:full].tolist(), comp[:full].tolist()) if cc == c]
        assert sorted(in_full) == [i // n for i in range(len(in_full))]
        assert ds.epochs_at(steps - 1, batch_size)[path] == pytest.approx(len(pairs) / n)


def test_verify_detects_corrupted_tokens(tokenizer: Tokenizer, tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    path = tmp_path / "c"
    cache = write_cache(str(path), _docs(rng, 50, 5, 40, tokenizer.eos_id, tokenizer.vocab_size), tokenizer)
    cache.verify()
    data_file = next(p for p in (path / "tokens").rglob("*") if p.is_file() and p.name != "zarr.json")
    raw = bytearray(data_file.read_bytes())
    raw[20] ^= 0x01  # one flipped bit in the 11th token
    data_file.write_bytes(bytes(raw))
    with pytest.raises(CacheError, match=r"tokens of shard '<memory>' .* do not match the sha256"):
        TokenCache.open(str(path)).verify()


def test_token_ids_beyond_the_vocab_are_refused(tokenizer: Tokenizer, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"token id 800 is outside \[0, vocab_size=800\)"):
        write_cache(str(tmp_path / "w"), [[5, 6], [7, 800]], tokenizer)
    path = tmp_path / "ok"
    write_cache(str(path), [[5, 6, 7]], tokenizer)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["max_token_id"] = 900  # as if the arrays held an id the tokenizer cannot produce
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        CacheError, match=rf"token cache '{path}': holds token id 900 but its tokenizer has only"
    ):
        TokenCache.open(str(path))


def test_repetition_beyond_a_threshold_is_reported_and_logged(caches: dict[str, str], caplog) -> None:
    ds = MixtureDataset({caches["a"]: 0.5, caches["c"]: 0.5}, seq_len=16, seed=0, block_size=64)
    n_a, n_c = (len(s) for s in ds.sequences)
    steps, bs = 10_000_000, 8  # a long run over small components
    with caplog.at_level("WARNING", logger="schooner.tokenize"):
        report = ds.repetition(steps, bs, max_epochs=4.0)
    drawn = steps * bs / 2  # each component gets half of every block
    assert report["epochs"] == {
        caches["a"]: pytest.approx(drawn / n_a),
        caches["c"]: pytest.approx(drawn / n_c),
    }
    assert len(report["warnings"]) == 2 and all("more than max_epochs=4" in w for w in report["warnings"])
    assert f"mixture component {caches['c']!r} is repeated {drawn / n_c:,.1f} times" in caplog.text
    quiet = ds.repetition(1, 4, max_epochs=4.0)  # one step repeats nothing
    assert quiet["warnings"] == [] and max(quiet["epochs"].values()) < 1
    with pytest.raises(ValueError, match="num_steps must be an int >= 1"):
        ds.repetition(0, 4)
