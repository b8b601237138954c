"""Greedy decoding against a hand loop, and finding the latest checkpoint of a run folder."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from schooner.eval import find_checkpoint, greedy_tokens, list_checkpoints


class Bigram(eqx.Module):
    table: jax.Array

    def __call__(self, tokens, *, segment_ids=None):
        return self.table[tokens]


class PrefixMean(eqx.Module):
    embed: jax.Array
    out: jax.Array

    def __call__(self, tokens, *, segment_ids=None):
        t = tokens.shape[1]
        weights = jnp.tril(jnp.ones((t, t), jnp.float32))
        weights = weights / weights.sum(-1, keepdims=True)
        return jnp.einsum("ts,bsd,dv->btv", weights, self.embed[tokens], self.out)


def _successor_table(vocab):
    table = np.zeros((vocab, vocab), np.float32)
    table[np.arange(vocab), (np.arange(vocab) + 1) % vocab] = 5.0
    return jnp.asarray(table)


def test_greedy_follows_the_argmax_chain_and_stops_at_eos():
    model = Bigram(_successor_table(7))
    assert greedy_tokens(model, [2], 6) == [3, 4, 5, 6, 0, 1]
    assert greedy_tokens(model, [2], 6, eos_id=5) == [3, 4, 5]
    assert greedy_tokens(model, [6, 1], 0) == []


@pytest.mark.parametrize("max_seq_len", [4, 100])
def test_greedy_matches_a_hand_loop_with_a_context_model(max_seq_len):
    k1, k2 = jax.random.split(jax.random.key(0))
    model = PrefixMean(jax.random.normal(k1, (13, 6)), jax.random.normal(k2, (6, 13)))
    prompt = [3, 7, 1]
    ids = list(prompt)
    forward = eqx.filter_jit(model)  # one compilation a context length (op by op: one an op and length)
    for _ in range(10):
        context = jnp.asarray([ids[-max_seq_len:]], jnp.int32)
        ids.append(int(np.argmax(np.asarray(forward(context))[0, -1])))
    assert greedy_tokens(model, prompt, 10, max_seq_len=max_seq_len) == ids[len(prompt) :]


def test_greedy_rejects_bad_arguments():
    model = Bigram(_successor_table(3))
    with pytest.raises(ValueError, match="non-empty prompt"):
        greedy_tokens(model, [], 3)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        greedy_tokens(model, [1], -1)


def _touch_checkpoint(folder, complete=True):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    if complete:
        (folder / "checkpoint.json").write_text("{}")


def test_find_checkpoint_picks_the_highest_complete_step(tmp_path):
    run = tmp_path / "run"
    _touch_checkpoint(run / "step-000005")
    _touch_checkpoint(run / "step-000010")
    _touch_checkpoint(run / "step-000020", complete=False)  # still being written (no marker yet)
    _touch_checkpoint(run / "step-000030.tmp-123")  # a crashed write
    (run / "metrics.jsonl").write_text("")
    assert [s for s, _ in list_checkpoints(str(run))] == [5, 10]
    assert find_checkpoint(str(run)) == str(run / "step-000010")
    # a checkpoint folder itself is returned as is
    assert find_checkpoint(str(run / "step-000005")) == str(run / "step-000005")


def test_find_checkpoint_on_fsspec_memory():
    import fsspec

    fs = fsspec.filesystem("memory")
    for step in ("000003", "000012"):
        fs.pipe(f"/h7-run/step-{step}/config.json", b"{}")
        fs.pipe(f"/h7-run/step-{step}/checkpoint.json", b"{}")
    fs.pipe("/h7-run/step-000015/config.json", b"{}")
    try:
        assert find_checkpoint("memory://h7-run") == "memory://h7-run/step-000012"
    finally:
        fs.rm("/h7-run", recursive=True)


def test_find_checkpoint_explains_a_missing_checkpoint(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(FileNotFoundError, match="did training finish"):
        find_checkpoint(str(tmp_path / "run"))
    with pytest.raises(FileNotFoundError, match="no training output folder"):
        find_checkpoint(str(tmp_path / "missing"))


def test_latest_checkpoint_is_find_checkpoint_under_a_deprecated_name(tmp_path):
    """`schooner.train.latest_checkpoint` returns `(step, path) | None`; eval's name for the finder was the same
    word for another return type, so it is `find_checkpoint` now (schooner.model's), the old name warning."""
    import schooner.eval
    import schooner.model

    assert schooner.eval.find_checkpoint is schooner.model.find_checkpoint
    _touch_checkpoint(tmp_path / "run" / "step-000007")
    with pytest.warns(DeprecationWarning, match=r"schooner\.eval\.latest_checkpoint .*find_checkpoint"):
        from schooner.eval import latest_checkpoint
    assert latest_checkpoint(str(tmp_path / "run")) == str(tmp_path / "run" / "step-000007")
