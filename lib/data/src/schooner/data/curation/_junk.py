"""Junk for the offline crawl and for training a quality classifier: site chrome, keyword spam, fluent
spam (sentences that pass heuristic rules: what a trained classifier is for), thin pages.

`junk_records(count, seed)` writes the same kinds as text records, with a seed of their own: negatives for
`train_quality_classifier` (a stand-in for the sampled or hand-labelled low-quality web text real
pipelines train on), never the crawl's own pages.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

SPAM_WORDS = [
    'cheap', 'pills', 'best', 'price', 'buy', 'now', 'free', 'shipping', 'casino', 'bonus',
    'win', 'money', 'fast', 'click', 'here', 'discount', 'deal', 'offer', 'limited', 'sale',
    'promo', 'code', 'luxury', 'watches', 'replica', 'cash', 'loans', 'credit', 'instant', 'approval',
    'weight', 'loss', 'miracle', 'cure', 'crypto', 'profit', 'guaranteed', 'jackpot', 'lottery', 'prize',
    'winner', 'exclusive', 'vip', 'hot', 'singles', 'dating', 'online', 'pharmacy',
]  # fmt: skip
"""Vocabulary of the spam pages and ads."""

_SEO = (
    ("The", "Our", "This year the", "Every week the"),
    ("best", "cheapest", "most trusted", "number one"),
    (
        "online casino",
        "replica watches",
        "crypto exchange",
        "weight loss pills",
        "payday loans",
        "dating site",
    ),
    ("is waiting for you", "offers a free bonus", "gives you instant approval", "has a limited offer"),
    ("and you will", "so that you can", "and with our code you", "because today you can"),
    ("win a prize", "save money", "get rich fast", "meet hot singles", "lose weight"),
    ("with no risk at all", "in just one click", "before the offer ends", "with guaranteed results"),
)


def chrome(rng: random.Random, site: int, modules: Sequence[str]) -> dict[str, str]:
    """Site chrome (navigation, sidebar, cookie banner, an ad, footer) as HTML fragments, varied per site."""
    links = "".join(f'<li><a href="/{w}">{w.title()}</a></li>' for w in rng.sample(
        ["home", "docs", "blog", "news", "about", "contact", "download", "community", "events", "jobs"], 6))  # fmt: skip
    related = "".join(f'<li><a href="/m/{m}.html">{m}</a></li>' for m in rng.sample(list(modules), 8))
    return {
        "nav": f'<header class="site-header"><div class="logo">PyDocs Mirror {site}</div>'
        f'<nav class="navbar menu"><ul>{links}</ul></nav></header>',
        "sidebar": f'<aside class="sidebar"><h3>Related modules</h3><ul>{related}</ul></aside>',
        "cookie": '<div id="cookie-banner" class="cookie-consent banner">We use cookies to improve your '
        "experience. By continuing to browse this site you agree to our use of cookies. "
        '<a href="/privacy">Privacy policy</a> <button>Accept all</button></div>',
        "ad": f'<div class="ad advertisement sponsored">Sponsored: {" ".join(rng.sample(SPAM_WORDS, 6))}! '
        '<a href="http://ads.example/">Learn more</a></div>',
        "footer": f'<footer class="site-footer"><p>© 2024 PyDocs Mirror {site}. All rights reserved.</p>'
        '<p><a href="/terms">Terms of use</a> · <a href="/privacy">Privacy policy</a> · '
        '<a href="/contact">Contact</a></p></footer>',
    }


def spam_page(rng: random.Random, i: int) -> str:
    """Keyword stuffing: 400 spam words in paragraphs, no sentences."""
    vocab = rng.sample(SPAM_WORDS, 12)
    words = [rng.choice(vocab) for _ in range(400)]
    return (
        "<h1>BEST DEALS "
        + str(i)
        + "</h1>"
        + "".join(f"<p>{' '.join(words[k : k + 20])}</p>" for k in range(0, 400, 20))
    )


def low_quality_page(rng: random.Random, i: int) -> str:
    """Thin pages: a one-liner, a bullet list, lorem ipsum, symbols (by `i % 4`)."""
    kind = i % 4
    if kind == 0:
        return f"<p>Click here for page {i}.</p>"
    if kind == 1:
        return "<ul>" + "".join(f"<li>• item {k * (i + 1)}</li>" for k in range(40)) + "</ul>"
    if kind == 2:
        lorem = (
            f"Lorem ipsum dolor sit amet {i}, consectetur adipiscing elit, sed do eiusmod tempor incididunt. "
        )
        return "".join(f"<p>{lorem * 2}</p>" for _ in range(8))
    return "<p>" + " ".join(rng.choice(["#", "###", "...", "|", "$$", "%%"]) for _ in range(300)) + "</p>"


def seo_spam_page(rng: random.Random, i: int) -> str:
    """Fluent spam: 30 sentences of spam written with stop words and punctuation, as SEO pages are; it
    passes Gopher's quality rules and C4's, so only a trained classifier (or a blocklist) removes it."""
    sentences = [" ".join(rng.choice(part) for part in _SEO) + "." for _ in range(30)]
    paras = ["<p>" + " ".join(sentences[k : k + 5]) + "</p>" for k in range(0, 30, 5)]
    return f"<h1>{rng.choice(_SEO[2]).title()} {i}: the offer of the day</h1>" + "".join(paras)


def junk_records(count: int, seed: int = 1) -> list[dict]:
    """`count` junk texts (cycling through keyword spam, fluent spam, thin pages and site boilerplate) as
    records `{"id", "text", "source": "junk", "metadata": {"kind"}}`, visible text as the extractor
    sees it."""
    from .crawl import MODULES, visible_text

    rng = random.Random(seed)
    out = []
    for i in range(count):
        kind = ("spam", "seo_spam", "low_quality", "boilerplate")[i % 4]
        if kind == "spam":
            html = spam_page(rng, i)
        elif kind == "seo_spam":
            html = seo_spam_page(rng, i)
        elif kind == "low_quality":
            html = low_quality_page(rng, i // 4)
        else:
            parts = chrome(rng, i, MODULES)
            html = "".join(parts[k] for k in rng.sample(sorted(parts), 3))
        out.append({"id": f"junk-{seed}-{i}", "text": visible_text(html), "source": "junk",
                    "metadata": {"kind": kind}})  # fmt: skip
    return out
