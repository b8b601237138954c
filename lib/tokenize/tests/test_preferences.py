"""Preference caches (DPO): the prompt/answer boundary in token space, masks over answers, pairwise batches,
and the tokenized_chat / tokenized_preferences steps. Expected ids come from HF `tokenizers` directly."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from schooner.cluster import LocalClient, StepRunner
from schooner.data import write_records
from schooner.tokenize import (
    AllMaskedError,
    CacheError,
    DataLoader,
    MixtureDataset,
    PreferenceDataset,
    TokenCache,
    Tokenizer,
    build_cache,
    chat_record,
    load_tokenizer,
    preference_record,
)
from schooner.tokenize.steps import tokenized_chat, tokenized_preferences

from .test_chat_cache import check_document, conversations


def hf_ids(tok: Tokenizer, text: str) -> list[int]:
    """Ids from the HF tokenizer itself, special-token strings as plain text (the independent reference)."""
    import tokenizers

    hf = tokenizers.Tokenizer.from_str(tok.hf.to_str())
    hf.encode_special_tokens = True
    return hf.encode(text, add_special_tokens=False).ids


def string_pairs(n: int) -> list[dict]:
    return [
        preference_record(
            prompt=f"def f{i}(x):\n    return",  # ends where BPE would merge with a leading space
            chosen=f" x + {i}  # the answer 🚀",
            rejected=f" x * {i}" + " wrong" * (i % 4),
            source="prefs",
            id=f"p{i}",
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def client():
    c = LocalClient(max_workers=2)
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def pref_cache(tokenizer_path, client, tmp_path_factory) -> str:
    src = str(tmp_path_factory.mktemp("prefs") / "recs")
    write_records(string_pairs(30), src, num_shards=3)
    out = str(tmp_path_factory.mktemp("prefcache") / "out")
    build_cache(src, out, tokenizer_path, kind="preference", prepend_bos=True, client=client)
    return out


def test_string_pairs_split_prompt_and_answer_in_token_space(pref_cache, tokenizer) -> None:
    cache = TokenCache.open(pref_cache, tokenizer=tokenizer)
    assert cache.kind == "preference" and cache.num_documents == 60
    cache.verify()
    recs = {r["id"]: r["metadata"] for r in string_pairs(30)}
    for pair in range(30):
        chosen_info, rejected_info = cache.document_info(2 * pair), cache.document_info(2 * pair + 1)
        assert (chosen_info["role"], rejected_info["role"]) == ("chosen", "rejected")
        assert chosen_info["id"] == rejected_info["id"]
        rec = recs[chosen_info["id"]]
        prompt = [tokenizer.bos_id, *hf_ids(tokenizer, rec["prompt"])]
        for doc, role in ((2 * pair, "chosen"), (2 * pair + 1, "rejected")):
            lo, hi = cache.document_bounds(doc)
            answer = hf_ids(tokenizer, rec[role]) + [tokenizer.eos_id]
            assert cache.tokens(lo, hi).tolist() == prompt + answer
            assert cache.loss_mask(lo, hi).tolist() == [0] * len(prompt) + [1] * len(answer)


def test_message_pairs_sharing_a_prefix_mask_only_the_final_answer(tokenizer, client, tmp_path) -> None:
    base = conversations(8)
    recs = []
    for i, conv in enumerate(base):
        prefix = conv[:-1]  # ends before the last assistant turn
        chosen = [*prefix, {"role": "assistant", "content": f"right {i} ✓"}]
        rejected = [*prefix, {"role": "assistant", "content": f"wrong {i}"}]
        recs.append(preference_record(chosen=chosen, rejected=rejected, source="m", id=f"m{i}"))
    src = str(tmp_path / "recs")
    write_records(recs, src)
    build_cache(src, str(tmp_path / "out"), tokenizer, kind="preference", client=client)
    cache = TokenCache.open(str(tmp_path / "out"))
    for i, conv in enumerate(base):
        prefix = conv[:-1]
        for doc, content in ((2 * i, f"right {i} ✓"), (2 * i + 1, f"wrong {i}")):
            lo, hi = cache.document_bounds(doc)
            ids, mask = cache.tokens(lo, hi), cache.loss_mask(lo, hi)
            msgs = [*prefix, {"role": "assistant", "content": content}]
            # checked against the text: only the last assistant message (and its end-of-turn) is a target
            check_document(tokenizer, ids, mask, msgs, last_only=True)


def test_preference_batches_are_pairs_pure_in_seed_and_step(pref_cache, tokenizer) -> None:
    ds = PreferenceDataset(pref_cache, seq_len=40, seed=5)
    cache = TokenCache.open(pref_cache)
    b = ds.batch(2, 4)
    assert set(b) == {
        f"{r}_{k}" for r in ("chosen", "rejected") for k in ("tokens", "loss_mask", "segment_ids")
    } | {"pair_index"}
    for row, pair in enumerate(b["pair_index"]):
        for j, role in enumerate(("chosen", "rejected")):
            doc = cache.document(2 * pair + j)
            n = min(doc.size, 40)
            assert b[f"{role}_tokens"][row, :n].tolist() == doc[:n].tolist()
            assert (b[f"{role}_segment_ids"][row, :n] == 0).all() and (
                b[f"{role}_segment_ids"][row, n:] == 1
            ).all()
            assert b[f"{role}_loss_mask"][row, n:].sum() == 0 and b[f"{role}_loss_mask"][row].sum() > 0
    again = PreferenceDataset(pref_cache, seq_len=40, seed=5).batch(2, 4)
    assert all(np.array_equal(b[k], again[k]) for k in b)
    epoch = np.concatenate([ds.batch(s, 5)["pair_index"] for s in range(6)])
    assert sorted(epoch.tolist()) == list(range(30))  # each epoch visits every pair once
    with pytest.raises(AllMaskedError, match=r"id 'p\d+'.*pair \d+.*beyond seq_len=5"):
        PreferenceDataset(pref_cache, seq_len=5)
    with pytest.raises(Exception, match="preference cache.*PreferenceDataset"):
        MixtureDataset({pref_cache: 1.0}, seq_len=16)


def test_loader_places_pair_batches(pref_cache) -> None:
    ds = PreferenceDataset(pref_cache, seq_len=32)
    sharding = NamedSharding(jax.make_mesh((8,), ("data",)), PartitionSpec("data", None))
    for host_local in (False, True):
        with DataLoader(ds, 8, sharding=sharding, stop_step=2, host_local=host_local) as loader:
            for step, batch in loader:
                want = ds.batch(step, 8)
                assert batch["pair_index"].shape == (8,) and batch["chosen_tokens"].sharding == sharding
                assert all(np.array_equal(np.asarray(batch[k]), want[k]) for k in want)


def test_chat_and_preference_steps(tokenizer_path, tmp_path) -> None:
    chats = str(tmp_path / "chats")
    write_records(
        [chat_record(m, source="c", id=f"c{i}") for i, m in enumerate(conversations(30))], chats, num_shards=2
    )
    prefs = str(tmp_path / "prefs")
    write_records(string_pairs(20), prefs, num_shards=2)
    sft = tokenized_chat("tokenized/chat", source=chats, tokenizer=tokenizer_path, validation_fraction=0.2)
    dpo = tokenized_preferences(
        "tokenized/prefs", source=prefs, tokenizer=tokenizer_path, validation_fraction=0.2
    )
    result = StepRunner(prefix=str(tmp_path / "p"), quiet=True).run([sft, dpo])
    out_sft, out_dpo = result[sft].output_path, result[dpo].output_path
    tok = load_tokenizer(out_sft)
    train, val = TokenCache.open(f"{out_sft}/train", tokenizer=tok), TokenCache.open(f"{out_sft}/validation")
    assert (
        train.kind == val.kind == "chat"
        and train.num_documents + val.num_documents == 30
        and val.num_documents
    )
    assert result[sft].result["train_documents"] == train.num_documents
    b = MixtureDataset({out_sft: 1.0}, seq_len=256).batch(0, 4)
    assert b["loss_mask"].sum() > 0
    p_train, p_val = TokenCache.open(f"{out_dpo}/train"), TokenCache.open(f"{out_dpo}/validation")
    assert p_train.num_documents + p_val.num_documents == 40 and p_val.num_documents % 2 == 0
    assert len(PreferenceDataset(out_dpo, seq_len=64)) == p_train.num_documents // 2
    again = StepRunner(prefix=str(tmp_path / "p"), quiet=True).run(
        [tokenized_chat("tokenized/chat", source=chats, tokenizer=tokenizer_path, validation_fraction=0.2)]
    )
    assert again[sft].state == "cached"
    assert (
        tokenized_chat("tokenized/chat", source=chats, tokenizer=tokenizer_path, chat_template="chatml").key
        != sft.key
    )
    with pytest.raises(ValueError, match="chat_template 'llama9' is not one of"):
        tokenized_chat("x", source=chats, tokenizer=tokenizer_path, chat_template="llama9")
    with pytest.raises(CacheError, match="chat cache .* not a preference cache"):
        PreferenceDataset(out_sft, seq_len=64)


def test_chat_step_identity_follows_the_tokenizers_own_chat_template(tokenizer, tmp_path) -> None:
    """A chat step with no chat_template= renders with the one the tokenizer folder's tokenizer_config.json
    names (`schooner_chat_template`), which the fingerprint does not cover: editing it is another step."""
    import json
    from pathlib import Path

    from schooner.cluster import StepFailedError
    from schooner.tokenize import train_bpe

    from .conftest import stdlib_texts

    specials = (*tokenizer.special_tokens, "<|im_start|>", "<|im_end|>")
    tok = train_bpe(stdlib_texts(8), vocab_size=500, special_tokens=specials)
    folder = Path(tok.save(tmp_path / "tok"))
    chats = str(tmp_path / "chats")
    write_records([chat_record(m, source="c", id=f"c{i}") for i, m in enumerate(conversations(6))], chats)
    before = tokenized_chat("tokenized/chat", source=chats, tokenizer=str(folder), validation_fraction=0.0)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    assert cfg["schooner_chat_template"] == "schooner"
    cfg["schooner_chat_template"] = "chatml"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    after = tokenized_chat("tokenized/chat", source=chats, tokenizer=str(folder), validation_fraction=0.0)
    assert after.key != before.key
    out = StepRunner(prefix=str(tmp_path / "p"), quiet=True).run([after])[after].output_path
    assert tok.token_to_id("<|im_start|>") in TokenCache.open(out).document(0)
    with pytest.raises(StepFailedError, match="changed since the step was defined"):
        StepRunner(prefix=str(tmp_path / "q"), quiet=True).run([before])
