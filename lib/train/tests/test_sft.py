"""SFT: the train step's loss on packed chat rows equals a numpy cross-entropy over each conversation's
assistant tokens, scored alone; the held-out chat evaluation likewise; a conversation with nothing to train
on is an error; fine-tuning on a small chat set lowers its held-out loss."""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
import pytest

from schooner.train import AdamConfig, CheckpointConfig, TrackerConfig, TrainerConfig, train


def _chats(n: int, seed: int = 0) -> list[list[dict]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        a, b = (int(x) for x in rng.integers(0, 50, 2))
        msgs = [
            {"role": "user", "content": f"What is {a} + {b}?"},
            {"role": "assistant", "content": str(a + b)},
        ]
        if a % 3 == 0:
            msgs = [{"role": "system", "content": "Answer with a number."}, *msgs]
        out.append(msgs)
    return out


@pytest.fixture(scope="module")
def chat_dir(data_dir, tmp_path_factory) -> str:
    """A chat cache `<dir>/train`, `<dir>/validation` built with the session tokenizer."""
    from schooner.cluster import LocalClient
    from schooner.data import write_records
    from schooner.tokenize import build_cache, chat_record

    root = tmp_path_factory.mktemp("chat")
    records = [chat_record(m, source="arith", id=f"c{i}") for i, m in enumerate(_chats(400))]
    write_records(records, str(root / "records"), num_shards=2)
    build_cache(
        str(root / "records"),
        str(root / "cache"),
        f"{data_dir}/tokenizer.json",
        kind="chat",
        validation_fraction=0.15,
        client=LocalClient(max_workers=1),
    )
    return str(root / "cache")


@pytest.fixture(scope="module")
def init_checkpoint(nano, tmp_path_factory) -> str:
    """A randomly initialised model saved as a checkpoint folder."""
    from schooner.model import init, save_model

    folder = str(tmp_path_factory.mktemp("init") / "ckpt")
    cfg = nano()
    save_model(folder, init(cfg, key=jax.random.PRNGKey(3)), cfg)
    return folder


def _numpy_masked_ce(model, cache, docs) -> tuple[float, float]:
    """(summed nats, target count) over the assistant tokens of `docs`, each conversation run alone."""
    import equinox as eqx

    forward = eqx.filter_jit(lambda m, t: m(t))
    offsets = cache.offsets()
    nats = count = 0.0
    for d in docs:
        start, stop = int(offsets[d]), int(offsets[d + 1])
        toks = np.asarray(cache.tokens(start, stop))
        mask = np.asarray(cache.loss_mask(start, stop))
        # Alone in a row, padded at the end (causal attention: the padding changes nothing before it).
        padded = np.zeros((1, 64), np.int32)
        padded[0, : len(toks)] = toks
        logits = np.asarray(forward(model, padded), np.float64)[0, : len(toks)]
        logp = logits - logits.max(-1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
        for t in range(len(toks) - 1):
            if mask[t + 1]:
                nats -= logp[t, toks[t + 1]]
                count += 1
    return nats, count


def test_the_step_loss_is_the_masked_cross_entropy_of_each_conversation(nano, chat_dir) -> None:
    from schooner.model import init
    from schooner.tokenize import MixtureDataset, TokenCache
    from schooner.train import build_optimizer, init_state, make_train_step

    model = init(nano(), key=jax.random.PRNGKey(0))
    ds = MixtureDataset({f"{chat_dir}/train": 1.0}, seq_len=64, seed=0)
    batch = ds.batch(0, 4)
    assert (batch["loss_mask"].sum(1) > 0).all() and (batch["segment_ids"].max(1) >= 2).any()  # packed rows
    tx = build_optimizer(AdamConfig(learning_rate=1e-3), model, 10)
    step = make_train_step(tx, z_loss_weight=0.0, microbatches=1, lr_schedule=lambda s: 1e-3)
    _, metrics = jax.jit(step)(init_state(model, tx, jax.random.PRNGKey(1)), batch)

    # Which conversations the rows hold: match each segment's tokens to a cache document.
    cache = TokenCache.open(f"{chat_dir}/train")
    offsets = cache.offsets()
    docs_by_tokens = {
        tuple(cache.tokens(int(offsets[d]), int(offsets[d + 1]))): d for d in range(cache.num_documents)
    }
    docs = []
    for r in range(4):
        for s in np.unique(batch["segment_ids"][r]):
            sel = batch["segment_ids"][r] == s
            if batch["loss_mask"][r][sel].any():
                docs.append(docs_by_tokens[tuple(batch["tokens"][r][sel])])
    nats, count = _numpy_masked_ce(model, cache, docs)
    assert float(metrics["token_count"]) == count
    assert float(metrics["loss"]) == pytest.approx(nats / count, rel=1e-4)


def test_the_held_out_chat_evaluation_is_the_masked_cross_entropy(nano, chat_dir, data_dir) -> None:
    from schooner.model import init
    from schooner.tokenize import TokenCache, load_tokenizer
    from schooner.train import ChatEvaluator

    model = init(nano(), key=jax.random.PRNGKey(0))
    cache = TokenCache.open(f"{chat_dir}/validation")
    byte_lengths = load_tokenizer(f"{data_dir}/tokenizer.json").token_byte_lengths()
    ev = ChatEvaluator(
        {"chat": cache.path}, seq_len=64, batch_size=3, max_tokens=None, byte_lengths=byte_lengths
    )
    got = ev.score(model, "chat")
    nats, count = _numpy_masked_ce(model, cache, range(cache.num_documents))
    assert got["tokens"] == count
    assert got["loss"] == pytest.approx(nats / count, rel=1e-4)
    # Bits per byte: the same nats over the bytes of the target tokens.
    offsets = cache.offsets()
    nbytes = 0
    for d in range(cache.num_documents):
        toks = np.asarray(cache.tokens(int(offsets[d]), int(offsets[d + 1])))
        mask = np.asarray(cache.loss_mask(int(offsets[d]), int(offsets[d + 1])))
        nbytes += int((byte_lengths[toks[1:]] * mask[1:]).sum())
    assert got["bpb"] == pytest.approx(nats / np.log(2) / nbytes, rel=1e-4)


def test_a_conversation_with_nothing_to_train_on_is_an_error(
    nano, data_dir, init_checkpoint, tmp_path
) -> None:
    from schooner.cluster import LocalClient
    from schooner.data import write_records
    from schooner.tokenize import AllMaskedError, build_cache, chat_record

    long_question = " ".join(["word"] * 200)
    chats = [[{"role": "user", "content": long_question}, {"role": "assistant", "content": "ok"}]]
    write_records([chat_record(chats[0], source="long", id="the-long-one")], str(tmp_path / "r"))
    build_cache(
        str(tmp_path / "r"),
        str(tmp_path / "c"),
        f"{data_dir}/tokenizer.json",
        kind="chat",
        client=LocalClient(max_workers=1),
    )
    cfg = TrainerConfig(
        model=nano(),
        datasets={str(tmp_path / "c" / "train"): 1.0},
        seq_len=32,
        validation={},
        output_path=str(tmp_path / "run"),
        batch_size=8,
        num_train_steps=1,
        initialize_from=init_checkpoint,
    )
    with pytest.raises(AllMaskedError, match="the-long-one"):
        train(cfg)


@pytest.mark.slow
def test_sft_lowers_the_held_out_chat_loss(nano, chat_dir, data_dir, init_checkpoint, tmp_path) -> None:
    from schooner.model import load_model
    from schooner.tokenize import load_tokenizer
    from schooner.train import ChatEvaluator

    out = str(tmp_path / "sft")
    cfg = TrainerConfig(
        model=nano(),
        datasets={f"{chat_dir}/train": 1.0},
        seq_len=64,  # validation: the chat cache's own
        output_path=out,
        batch_size=8,
        num_train_steps=40,
        optimizer=AdamConfig(learning_rate=3e-3, warmup=4),
        checkpoint=CheckpointConfig(every=None),
        trackers=TrackerConfig(loss_plot=False),
        tokenizer=f"{data_dir}/tokenizer.json",
        initialize_from=init_checkpoint,
    )
    summary = train(cfg)
    before_model, _ = load_model(init_checkpoint)
    ev = ChatEvaluator(
        {"cache": f"{chat_dir}/validation"},
        seq_len=64,
        batch_size=8,
        max_tokens=cfg.data.eval_max_tokens,
        byte_lengths=load_tokenizer(f"{data_dir}/tokenizer.json").token_byte_lengths(),
    )
    before = ev(before_model)
    after = summary["eval"]
    assert set(after) >= {"eval/cache/loss", "eval/cache/bpb", "eval/loss"}
    assert after["eval/cache/loss"] < 0.5 * before["eval/cache/loss"], (before, after)
    assert after["eval/cache/bpb"] < 0.5 * before["eval/cache/bpb"]
    # The evaluator the run used gives the final checkpoint's numbers.
    final, _ = load_model(summary["checkpoint"])
    assert ev(final)["eval/cache/loss"] == pytest.approx(after["eval/cache/loss"], rel=1e-5)
    assert os.path.exists(f"{out}/metrics.jsonl")


def test_the_sft_step_builds_a_train_lm_handle_from_the_source(init_checkpoint, chat_dir) -> None:
    from schooner.train.steps import sft
    from schooner.train.steps import trained_model_config as train_lm_model_config

    h = sft(
        "sft",
        initialize_from=init_checkpoint,
        datasets={chat_dir: 1.0},
        batch_size=8,
        seq_len=64,
        num_train_steps=10,
    )
    assert train_lm_model_config(h).num_layers == 2  # export_hf and a later dpo/sft take it
    assert h.config.optimizer.schedule == "linear" and str(h.config.initialize_from) == init_checkpoint
    assert dataclasses.replace(h.config.optimizer).learning_rate == 1e-4


def _export_chat_trained(init_checkpoint, data_dir, chat_dir, out) -> dict:
    """Export `init_checkpoint` as a run trained on `chat_dir` would be (its chat cache among the sources)."""
    from schooner.train._export import ExportHfConfig, _run_export_hf

    return _run_export_hf(
        ExportHfConfig(run=init_checkpoint, tokenizer=data_dir, tokenizer_sources=(chat_dir,)), str(out)
    )


def _token(value) -> str:
    return value["content"] if isinstance(value, dict) else value


def test_a_chat_model_s_export_and_sft_mask_end_the_turn(
    init_checkpoint, data_dir, chat_dir, tmp_path
) -> None:
    """generation_config.json stops on [EOS, end-of-turn]; the SFT mask trains each assistant turn's
    end-of-turn and the EOS after a final one, checked against the exported Jinja template rendered with
    jinja2 and tokenized with HF `tokenizers` (not schooner's renderer)."""
    import json

    import jinja2
    import tokenizers

    from schooner.tokenize import TokenCache

    out = tmp_path / "hf"
    _export_chat_trained(init_checkpoint, data_dir, chat_dir, out)
    hf = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    tcfg = json.loads((out / "tokenizer_config.json").read_text())
    eos, eot = hf.token_to_id(_token(tcfg["eos_token"])), hf.token_to_id("<|end_of_turn|>")
    assistant = hf.token_to_id("<|assistant|>")
    roles = {hf.token_to_id(f"<|{r}|>") for r in ("system", "user", "assistant", "tool")}
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [eos, eot]
    # a base model (no chat data behind it) keeps the EOS alone
    from schooner.train._export import ExportHfConfig, _run_export_hf

    _run_export_hf(ExportHfConfig(run=init_checkpoint, tokenizer=data_dir), str(tmp_path / "base"))
    assert json.loads((tmp_path / "base" / "generation_config.json").read_text())["eos_token_id"] == eos

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders it
    template = env.from_string(tcfg["chat_template"])
    chats = _chats(400)
    cache = TokenCache.open(f"{chat_dir}/train")
    checked = 0
    for d in range(min(60, cache.num_documents)):
        messages = chats[int(cache.document_info(d)["id"][1:])]
        text = template.render(
            messages=messages, bos_token=_token(tcfg["bos_token"]), add_generation_prompt=False
        )
        want = hf.encode(text, add_special_tokens=False).ids + [eos]  # the cache closes a document with EOS
        lo, hi = cache.document_bounds(d)
        ids, mask = cache.tokens(lo, hi).tolist(), cache.loss_mask(lo, hi).tolist()
        assert ids == want
        role = None
        for k, t in enumerate(ids):
            role = t if t in roles else role
            if t == eot:  # an end-of-turn: a target exactly in an assistant turn
                assert mask[k] == int(role == assistant), (d, k)
                checked += role == assistant
        assert messages[-1]["role"] == "assistant" and mask[-1] == 1  # the EOS closing the answer
    assert checked >= 60


def test_transformers_generate_stops_at_the_end_of_the_answer(
    init_checkpoint, data_dir, chat_dir, tmp_path
) -> None:
    """The exported folder in transformers: `generate` (steered to answer "42" then end the turn) stops
    right after the end-of-turn token, not at `max_new_tokens`."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")

    out = tmp_path / "hf"
    _export_chat_trained(init_checkpoint, data_dir, chat_dir, out)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 40 + 2?"}], add_generation_prompt=True, return_tensors="pt"
    )
    prompt = prompt["input_ids"] if not isinstance(prompt, torch.Tensor) else prompt
    eot = tok.convert_tokens_to_ids("<|end_of_turn|>")
    answer = [*tok.encode("42", add_special_tokens=False), eot]
    filler = tok.encode("x", add_special_tokens=False)

    def allowed(_batch: int, ids) -> list[int]:  # the answer, its end-of-turn, then anything but a stop
        k = ids.shape[-1] - prompt.shape[-1]
        return [answer[k]] if k < len(answer) else filler

    generated = model.generate(
        prompt, max_new_tokens=len(answer) + 8, prefix_allowed_tokens_fn=allowed, do_sample=False
    )
    assert generated[0, prompt.shape[-1] :].tolist() == answer
