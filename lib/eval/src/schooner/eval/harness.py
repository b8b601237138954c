"""The lm-evaluation-harness adapter: any harness task runs on a Schooner checkpoint (extra `[harness]`).

Importing this module imports `lm_eval` (nothing else in `schooner.eval` does) and registers the model
`schooner` in lm-eval's registry. lm-eval has no plugin lookup for models, so a bare `lm_eval --model schooner`
does not see it; `schooner-lm-eval` (or `python -m schooner.eval.lm_eval_cli`) is lm-eval's own command line
with this module imported first, taking the same arguments:

    schooner-lm-eval --model schooner --model_args checkpoint=/runs/nano,tokenizer=/tok --tasks piqa

In Python: `lm_eval.simple_evaluate(model=SchoonerLM(checkpoint=..., tokenizer=...), tasks=[...])`.

Log-likelihoods go through `schooner.eval.score_requests`, the scorer of Schooner's own tasks, on requests
split by `encode_pair` (lm-eval's own `_encode_pair` rule: trailing whitespace to the continuation, cut from
the whole string's tokens), each string encoded as lm-eval's `hf` backend encodes it (`tok_encode`: a
special-token string in the text, "<|end_of_text|>", is that special token, and the tokenizer's
post-processor runs unless the string starts with the BOS string or `add_bos_token` says otherwise): the adapter's numbers equal Schooner's for the same requests, and do not depend
on the harness's batch size or request order. Generation uses the KV cache
(`generate_texts`; greedy unless the request asks to sample), cut at the first of the request's `until` strings.
"""

from __future__ import annotations

from typing import Any

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from ._checkpoint import load_checkpoint
from ._kv_generate import SamplingConfig, generate_texts
from ._loglikelihood import encode_pair, model_max_length, score_requests, score_rolling, start_id

GEN_TOKS_ALIASES = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")
"""Names a generation request gives its token budget by, in lm-eval's order of priority."""


@register_model("schooner")
class SchoonerLM(TemplateLM):
    """A Schooner model for lm-evaluation-harness.

    Args:
        checkpoint: a checkpoint folder or a training run folder (its latest complete checkpoint), or None
            when `model` is given.
        tokenizer: a tokenizer folder/name for `schooner.tokenize.load_tokenizer`, or a `Tokenizer`.
        model: an already loaded model (instead of `checkpoint`).
        batch_size: requests per device call (speed only).
        max_length: the scoring window (default: the model's `max_seq_len`).
        max_gen_toks: default tokens to generate when a request does not say (default 256, as lm-eval's, or half
            the window when that is shorter, so a small model's context keeps room).
        add_bos_token: as lm-eval's `hf` backend's: run the tokenizer's post-processor (True) or not (False)
            when encoding text; None (default): the tokenizer's default, as `transformers` (run it).
        stop_at_end_of_turn: `generate_until` also stops at the end-of-turn token of the tokenizer's chat
            template (`<|end_of_turn|>`, `<|im_end|>`), as the `hf` backend stops at every id of a chat model's
            `generation_config.eos_token_id` (`export_hf` of a chat-trained run writes [EOS, end-of-turn]).
            None (default): when the tokenizer has such a token; False: at EOS only (what the `hf` backend
            does on a base model's export; a base model never trained on the token does not emit it).
    """

    def __init__(
        self,
        checkpoint: str | None = None,
        tokenizer: Any = None,
        *,
        model: Any = None,
        batch_size: int | str = 8,
        max_length: int | None = None,
        max_gen_toks: int | None = None,
        add_bos_token: bool | str | None = None,
        stop_at_end_of_turn: bool | str | None = None,
        **unused: Any,
    ) -> None:
        super().__init__()
        if model is None and checkpoint is None:
            raise ValueError("SchoonerLM needs checkpoint= (a checkpoint or run folder) or model=")
        if tokenizer is None:
            raise ValueError("SchoonerLM needs tokenizer= (the tokenizer folder the model was trained with)")
        if isinstance(tokenizer, str):
            from schooner.tokenize import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        if model is None:
            model, _, _ = load_checkpoint(str(checkpoint), tokenizer=tokenizer)
        self.model, self.tok = model, tokenizer
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8
        self.max_length = int(max_length) if max_length else model_max_length(model)
        self.max_gen_toks = int(max_gen_toks) if max_gen_toks else min(256, self.max_length // 2)
        self.add_bos_token = _flag("add_bos_token", add_bos_token)
        self.stop_token_ids = _end_of_turn_stop(tokenizer, _flag("stop_at_end_of_turn", stop_at_end_of_turn))

    @property
    def eot_token_id(self) -> int:
        return int(self.tok.eos_id) if self.tok.eos_id is not None else start_id(self.tok)

    @property
    def prefix_token_id(self) -> int:
        return start_id(self.tok)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """`string`'s tokens as lm-eval's `hf` backend encodes them (`HFLM.tok_encode`, which calls the HF
        tokenizer's `encode`): special-token strings in the text are the special tokens; the post-processor
        (a BOS some tokenizers add) runs per `add_special_tokens`, else `add_bos_token`, else by default,
        except for a string that already starts with the BOS (prefix token) string."""
        add = add_special_tokens
        if add is None:
            add = self.add_bos_token if self.add_bos_token is not None else True
            if string.startswith(self.tok.decode([self.prefix_token_id])):
                add = False
        return list(self.tok.encode(string, add_special_tokens=add, parse_special=True))

    def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True, **kwargs: Any) -> str:
        """As the hf backend's: special tokens left out unless `skip_special_tokens=False`."""
        return self.tok.decode(tokens, skip_special_tokens=skip_special_tokens)

    # -- chat templates (`--apply_chat_template`) -------------------------------------------------------
    @property
    def tokenizer_name(self) -> str:
        """The tokenizer's name in lm-eval's request cache: its fingerprint."""
        return f"schooner-{self.tok.fingerprint[:12]}"

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The Jinja template chats are rendered with (None when `chat_template` is off): the tokenizer's own
        (`schooner.tokenize.resolve_template`), or the Schooner template named by a string, as the tokenizer's
        `tokenizer_config.json` gives it to `transformers`."""
        if not chat_template:
            return None
        from schooner.tokenize import jinja_chat_template

        return jinja_chat_template(self._chat(None if chat_template is True else chat_template))

    def _chat(self, name: str | None) -> Any:
        from schooner.tokenize import resolve_template

        try:
            return resolve_template(self.tok, name)
        except ValueError as e:
            raise ValueError(f"--apply_chat_template: {e}") from None

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """`chat_history` as text, as the hf backend's `apply_chat_template` gives it: `transformers` rendering
        the tokenizer's Jinja template (`chat_template(True)`), with `continue_final_message` when no
        generation prompt is added: the final message left open, cut right after its content with its trailing
        white space kept (an assistant prefill such as lm-eval's `gen_prefix: "Answer: "`), as `transformers`
        does for a template that keeps the content's spacing, which Schooner's do. `tok_encode` then reads the
        header strings as special tokens."""
        template = self._chat(None)
        for i, m in enumerate(chat_history):
            if m.get("role") not in template.header or not isinstance(m.get("content"), str):
                raise ValueError(
                    f"apply_chat_template: message {i} is {m!r}; each message needs a role among "
                    f"{sorted(template.header)} and a string content"
                )
        parts = [self.tok.bos_token or ""] if template.bos else []
        for i, m in enumerate(chat_history):
            if not add_generation_prompt and i == len(chat_history) - 1:
                parts.append(template.header[m["role"]] + m["content"])
            else:
                parts.append(template.header[m["role"]] + m["content"] + template.footer)
        if add_generation_prompt:
            parts.append(template.header["assistant"])
        return "".join(parts)

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(log-probability, greedy) of each `(context, continuation)`, encoded by `encode_pair`."""
        return self._score(
            [self._encode_request(*req.args) for req in requests],
            [tuple(r.args) for r in requests],
            [_request_name(r, i) for i, r in enumerate(requests)],
        )

    def _encode_request(self, context: str, continuation: str) -> Any:
        """lm-eval's split of a request (`TemplateLM.loglikelihood`), strings encoded by `tok_encode`."""
        from ._loglikelihood import Request

        if context.rstrip():
            return encode_pair(_HarnessEncoding(self), context, continuation)
        if context == "":  # lm-eval: the continuation alone, without post-processor, after the prefix token
            cont = self.tok_encode(continuation, add_special_tokens=False)
            if cont[:1] == [self.prefix_token_id]:
                return Request(tuple(cont[:1]), tuple(cont[1:]))
            return Request((self.prefix_token_id,), tuple(cont))
        # white space alone: lm-eval's _encode_pair moves it to the continuation and cuts the whole string's
        # tokens after those of "" (the post-processor's alone); no context token left: the prefix token
        ctx = self.tok_encode("")
        cont = self.tok_encode(context + continuation)[len(ctx) :]
        return Request(tuple(ctx) or (self.prefix_token_id,), tuple(cont))

    def _loglikelihood_tokens(self, requests: list[Any], **kwargs: Any) -> list[tuple[float, bool]]:
        from ._loglikelihood import Request

        encoded = [Request(tuple(ctx) or (self.prefix_token_id,), tuple(cont)) for _, ctx, cont in requests]
        return self._score(encoded, [key for key, _, _ in requests])

    def _score(
        self, encoded: list[Any], keys: list[Any], names: list[str] | None = None
    ) -> list[tuple[float, bool]]:
        """Scores of `encoded`, each also given to lm-eval's cache hook (`--use_cache`) under its request's
        strings `(context, continuation)`, as the `hf` backend keys them (None: not cached); `names` for errors."""
        scores = score_requests(
            self.model, encoded, batch_size=self.batch_size, max_length=self.max_length, names=names
        )
        out = [(s.logprob, s.greedy) for s in scores]
        for key, result in zip(keys, out, strict=True):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Total log-probability of each whole text, every token predicted once (disjoint windows)."""
        docs = [self.tok_encode(req.args[0]) for req in requests]
        return score_rolling(
            self.model,
            docs,
            start=self.prefix_token_id,
            batch_size=self.batch_size,
            max_length=self.max_length,
        )

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Continuations of each context (KV cache, batched), cut before the first `until` string and at EOS (and
        at the end-of-turn token, see `stop_at_end_of_turn`), special tokens left out of the text (lm-eval's `hf`
        backend decodes with `skip_special_tokens=True`).

        As lm-eval's `hf` backend: up to `max_gen_toks` tokens (or its aliases `max_new_tokens`, `max_tokens`,
        `max_completion_tokens`; default the adapter's `max_gen_toks`) after the context's last
        `max_length - max_gen_toks` tokens (a longer context is cut from the left); sampling when `do_sample`
        is true, or when it is absent and `temperature` > 0 (with `top_k`/`top_p`/`seed`); greedy otherwise.
        """
        out = []
        for req in requests:
            context, kwargs = req.args
            kwargs = dict(kwargs or {})
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            do_sample = kwargs.get("do_sample")
            # sampling asked for without a temperature samples the model's own distribution
            temperature = float(kwargs.get("temperature", 1.0 if do_sample else 0.0) or 0.0)
            if do_sample is None:
                do_sample = temperature > 0.0
            sampling = SamplingConfig(
                temperature=temperature if do_sample else 0.0,
                top_k=kwargs.get("top_k") or None,  # transformers' 0: no top-k filtering
                top_p=kwargs.get("top_p"),
                seed=int(kwargs.get("seed", 0)),
            )
            n = next((kwargs[k] for k in GEN_TOKS_ALIASES if kwargs.get(k) is not None), self.max_gen_toks)
            n = int(n)
            if not 0 < n < self.max_length:
                raise ValueError(
                    f"generate_until: max_gen_toks={n} must be between 1 and the model's window less one "
                    f"({self.max_length - 1}) to leave room for the context; lower max_gen_toks in the task's "
                    "generation_kwargs (or the adapter's max_gen_toks)"
                )
            prompt = self.tok_encode(context) or [self.prefix_token_id]
            prompt = prompt[
                -(self.max_length - n) :
            ]  # lm-eval's left truncation to max_length - max_gen_toks
            # special tokens left out of the text, as the hf backend's tok_decode(skip_special_tokens=True)
            (text,) = generate_texts(
                self.model,
                self.tok,
                [prompt],
                n,
                sampling=sampling,
                stop=until,
                skip_special_tokens=True,
                stop_token_ids=self.stop_token_ids,
            )
            out.append(text)
        return out


def _flag(name: str, value: bool | str | None) -> bool | None:
    """A boolean model argument, given as a bool or (from `--model_args`) as "True"/"False"."""
    if isinstance(value, str):
        if value.lower() not in ("true", "false"):
            raise ValueError(f"SchoonerLM: {name} must be True or False, got {value!r}")
        return value.lower() == "true"
    return value


def _end_of_turn_stop(tok: Any, wanted: bool | None) -> list[int]:
    """`[id]` of the special token closing a turn in the tokenizer's chat template (the first of its footer's
    tokens that is one of the template's special tokens), or [] when it has none or `wanted` is False."""
    from schooner.tokenize import resolve_template

    if wanted is False:
        return []
    try:
        template = resolve_template(tok, None)
    except ValueError as e:
        if wanted:
            raise ValueError(f"SchoonerLM: stop_at_end_of_turn=True but {e}") from None
        return []
    special = {tok.token_to_id(t) for t in template.required_tokens} - {None}
    eot = next((int(i) for i in tok.encode(template.footer, parse_special=True) if i in special), None)
    if eot is None and wanted:
        raise ValueError(
            f"SchoonerLM: stop_at_end_of_turn=True but chat template {template.name!r} of tokenizer "
            f"{getattr(tok, 'source', 'unnamed')} closes a turn with no special token ({template.footer!r})"
        )
    return [] if eot is None else [eot]


class _HarnessEncoding:
    """The adapter's tokenizer as `encode_pair` uses it: text encoded by the adapter's `tok_encode`."""

    def __init__(self, lm: SchoonerLM) -> None:
        self.encode = lm.tok_encode
        self.bos_id, self.eos_id = lm.tok.bos_id, lm.tok.eos_id


def _request_name(request: Any, position: int) -> str:
    """An lm-eval request as an error names it: `"task 'arc_easy': document 17 (request 3)"` (its task, doc_id
    and index among the document's requests), `"request {position}"` when it carries none."""
    task, doc = getattr(request, "task_name", None), getattr(request, "doc_id", None)
    if task is None and doc is None:
        return f"request {position}"
    return f"task {task!r}: document {doc} (request {getattr(request, 'idx', position)})"
