"""Log-likelihood tasks: multiple choice and single continuation, their few-shot prompts and their metrics.

A task's documents are `Example`s: one or more (context, continuation) pairs and the index of the right one.
Multiple choice shares one context across choices ("Question: ...\nAnswer:" + " Paris" / " Rome"); a
partial-evaluation task (WinoGrande) has one context per choice and a shared continuation; a continuation task
(LAMBADA) has a single pair whose greedy match is the accuracy.

Metrics, per task (the mean over documents, with the standard error of the mean):

* `acc`: the highest total log-probability is the right choice.
* `acc_norm`: the same after dividing each log-probability by its continuation's length in characters (as
  lm-evaluation-harness does); `acc_norm_bytes` divides by UTF-8 bytes instead (comparable across
  tokenizers and scripts). Not reported for a task whose choices share one continuation and give no
  `answer_texts` (WinoGrande): the division changes nothing there, and lm-eval reports `acc` only.
* `prob_norm`: the probability of the right choice renormalised over the choices (softmax of log-probs).
* `logprob`: the right continuation's log-probability (nats).
* continuation tasks: `acc` is the greedy continuation matching every token, `perplexity` = exp(-mean logprob).

Few-shot prompts are drawn per document from a seeded generator keyed by (seed, document index), so the prompt
of document 17 is the same whichever other documents are evaluated, and never contains document 17 itself
when the few-shot pool is the evaluated split.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._loglikelihood import Request, Score, encode_pair, score_requests

KINDS = ("multiple_choice", "continuation")


@dataclasses.dataclass(frozen=True)
class Example:
    """One evaluated document.

    Attributes:
        contexts: the context of each choice; one entry shared by all choices, or one per choice.
        continuations: the continuation of each choice; one entry shared by all contexts, or one per choice.
        gold: index of the right choice.
        answer_texts: the text whose length normalises each choice (`acc_norm`); defaults to the continuations.
        source: where the document was read (`"arc.jsonl:18"`), for error messages; not part of its equality.
    """

    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    gold: int
    answer_texts: tuple[str, ...] = ()
    source: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        n = self.num_choices
        for label, items in (("contexts", self.contexts), ("continuations", self.continuations)):
            if len(items) not in (1, n) or not items:
                raise ValueError(f"Example.{label} must hold 1 or {n} entries, got {len(items)}: {items!r}")
        if not 0 <= self.gold < n:
            raise ValueError(f"Example.gold={self.gold} is not a choice index (0..{n - 1})")

    @property
    def num_choices(self) -> int:
        return max(len(self.contexts), len(self.continuations))

    def pairs(self) -> list[tuple[str, str]]:
        n = self.num_choices
        ctx = self.contexts * n if len(self.contexts) == 1 else self.contexts
        cont = self.continuations * n if len(self.continuations) == 1 else self.continuations
        return list(zip(ctx, cont, strict=True))

    @property
    def normalises(self) -> bool:
        """Whether `acc_norm` can differ from `acc`: not when every choice shares one continuation (partial
        scoring, WinoGrande) and no `answer_texts` give lengths of their own."""
        return bool(self.answer_texts) or len(self.continuations) > 1

    def norm_texts(self) -> tuple[str, ...]:
        if self.answer_texts:
            return self.answer_texts
        return tuple(c for _, c in self.pairs())

    def gold_text(self, delimiter: str) -> str:
        """The document with its right answer, as a few-shot demonstration."""
        context, continuation = self.pairs()[self.gold]
        return context + delimiter + continuation

    def with_prefix(self, prefix: str) -> Example:
        return dataclasses.replace(self, contexts=tuple(prefix + c for c in self.contexts))


def fewshot_prefix(
    index: int,
    pool: Sequence[Example],
    *,
    num_fewshot: int,
    seed: int,
    delimiter: str,
    separator: str,
    exclude_same_index: bool,
) -> str:
    """The few-shot demonstrations for document `index` (deterministic in (seed, index))."""
    if num_fewshot == 0:
        return ""
    candidates = [i for i in range(len(pool)) if not (exclude_same_index and i == index)]
    if len(candidates) < num_fewshot:
        raise ValueError(
            f"{num_fewshot}-shot prompts need {num_fewshot} few-shot documents but the pool holds "
            f"{len(candidates)}; lower num_fewshot or name a larger fewshot split"
        )
    rng = np.random.default_rng([seed, index])
    chosen = rng.choice(len(candidates), size=num_fewshot, replace=False)
    shots = [pool[candidates[int(c)]].gold_text(delimiter) for c in chosen]
    return separator.join(shots) + separator


def _mean_stderr(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, float("nan")
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def example_requests(tokenizer: Any, example: Example, delimiter: str) -> list[Request]:
    """The request of each choice of `example` (context, then `delimiter + continuation`): what a task scores.

    Example:
        >>> ex = Example(contexts=("Question: 2 + 2?\\nAnswer:",), continuations=("4", "5"), gold=0)
        >>> reqs = example_requests(tokenizer, ex, " ")  # [encode_pair(tokenizer, ctx, " 4"), ... " 5"]
    """
    return [encode_pair(tokenizer, context, delimiter + cont) for context, cont in example.pairs()]


def document_metrics(
    example: Example, scores: Sequence[Score], kind: str, *, norm: bool = True
) -> dict[str, float]:
    """The per-document metrics of one example from its choices' scores (`norm`: with `acc_norm` and
    `acc_norm_bytes`)."""
    logprobs = np.array([s.logprob for s in scores], np.float64)
    gold = example.gold
    if kind == "continuation":
        return {"acc": float(scores[gold].greedy), "logprob": float(logprobs[gold])}
    texts = example.norm_texts()
    chars = np.array([max(len(t), 1) for t in texts], np.float64)
    nbytes = np.array([max(len(t.encode("utf-8")), 1) for t in texts], np.float64)
    shifted = logprobs - logprobs.max()
    probs = np.exp(shifted) / np.exp(shifted).sum()
    out = {"acc": float(int(np.argmax(logprobs)) == gold)}
    if norm:
        out["acc_norm"] = float(int(np.argmax(logprobs / chars)) == gold)
        out["acc_norm_bytes"] = float(int(np.argmax(logprobs / nbytes)) == gold)
    return out | {"prob_norm": float(probs[gold]), "logprob": float(logprobs[gold])}


def aggregate(per_doc: Sequence[dict[str, float]], kind: str) -> dict[str, Any]:
    """Mean and standard error of each metric over documents (`{metric: value, metric_stderr: ...}`)."""
    if not per_doc:
        raise ValueError("no document to aggregate")
    out: dict[str, Any] = {}
    for metric in per_doc[0]:
        mean, stderr = _mean_stderr([d[metric] for d in per_doc])
        out[metric] = mean
        out[f"{metric}_stderr"] = stderr
    if kind == "continuation":
        out["perplexity"] = math.exp(min(-out["logprob"], 700.0))
    out["documents"] = len(per_doc)
    return out


def score_examples(
    model: Any,
    tokenizer: Any,
    examples: Sequence[Example],
    *,
    kind: str,
    delimiter: str = " ",
    batch_size: int = 8,
    max_length: int | None = None,
    task: str = "",
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Score prepared examples (few-shot prefixes already in their contexts).

    An error about one request (a continuation longer than the window) names `task`, the document's index
    and `Example.source`, and the choice.

    Returns:
        `(metrics, documents)`: the aggregate metrics and, per document, its metrics plus every choice's
        `logprobs`, `greedy` flags and the lengths `acc_norm` divides by (`norm_chars`, `norm_bytes`), for
        inspection, re-deriving the metrics and comparing with other scorers.
    """
    if kind not in KINDS:
        raise ValueError(f"task kind must be one of {KINDS}, got {kind!r}")
    requests: list[Request] = []
    names: list[str] = []
    spans: list[tuple[int, int]] = []
    for d, ex in enumerate(examples):
        reqs = example_requests(tokenizer, ex, delimiter)
        spans.append((len(requests), len(requests) + len(reqs)))
        requests.extend(reqs)
        doc = f"{f'task {task!r}: ' if task else ''}document {d}{f' ({ex.source})' if ex.source else ''}"
        names.extend(f"{doc}, choice {c}" for c in range(len(reqs)))
    scores = score_requests(model, requests, batch_size=batch_size, max_length=max_length, names=names)
    documents: list[dict[str, Any]] = []
    # acc_norm is a task's metric when any of its documents can normalise (lm-eval: per task, by its yaml)
    norm = any(ex.normalises for ex in examples)
    for ex, (a, b) in zip(examples, spans, strict=True):
        metrics = document_metrics(ex, scores[a:b], kind, norm=norm)
        documents.append(
            {
                **metrics,
                "gold": ex.gold,
                "logprobs": [s.logprob for s in scores[a:b]],
                "greedy": [s.greedy for s in scores[a:b]],
                # what acc_norm / acc_norm_bytes divide by (re-deriving them from `logprobs`)
                "norm_chars": [max(len(t), 1) for t in ex.norm_texts()],
                "norm_bytes": [max(len(t.encode("utf-8")), 1) for t in ex.norm_texts()],
            }
        )
    per_doc = [{k: float(d[k]) for k in document_metrics_keys(kind, norm=norm)} for d in documents]
    return aggregate(per_doc, kind), documents


def document_metrics_keys(kind: str, *, norm: bool = True) -> tuple[str, ...]:
    if kind == "continuation":
        return ("acc", "logprob")
    if not norm:
        return ("acc", "prob_norm", "logprob")
    return ("acc", "acc_norm", "acc_norm_bytes", "prob_norm", "logprob")
