"""schooner.data.curation: from a web crawl to clean, deduplicated, decontaminated text.

Operators as functions and configs (this module), as cached steps (`schooner.data.curation.steps`), an
offline test crawl (`schooner.data.fixtures`) and a page to look at record folders
(`schooner.data.curation.browse`). Heavy libraries (resiliparse, fastwarc, trafilatura, fastText,
floret, dupekit, rbloom, ftfy) come with `schooner-data[curation]` and are imported only inside the modules that
wrap them.
"""

from ._attributes import attribute_dataset as attribute_dataset
from ._attributes import iter_attributes as iter_attributes
from ._attributes import with_attributes as with_attributes
from ._classifier import ClassifierConfig as ClassifierConfig
from ._classifier import train_classifier as train_classifier
from ._clean import clean_text as clean_text
from ._clean import fix_text as fix_text
from ._clean import normalize_whitespace as normalize_whitespace
from ._clean import remove_invisible as remove_invisible
from ._consolidate import Keep as Keep
from ._consolidate import lang_is as lang_is
from ._consolidate import not_contaminated as not_contaminated
from ._consolidate import not_dup as not_dup
from ._consolidate import passes as passes
from ._consolidate import score_at_least as score_at_least
from ._consolidate import top_fraction as top_fraction
from ._decontam import DecontamConfig as DecontamConfig
from ._decontam import build_index as build_index
from ._decontam import contaminated_spans as contaminated_spans
from ._decontam import contamination_hits as contamination_hits
from ._decontam import load_eval_items as load_eval_items
from ._exact import exact_dedup_attributes as exact_dedup_attributes
from ._exact import paragraph_dedup_attributes as paragraph_dedup_attributes
from ._fuzzy import fuzzy_dedup_attributes as fuzzy_dedup_attributes
from ._html import RESILIPARSE_OPTIONS as RESILIPARSE_OPTIONS
from ._html import ExtractConfig as ExtractConfig
from ._html import decode_html as decode_html
from ._html import extract_text as extract_text
from ._html_files import html_dataset as html_dataset
from ._langid import LangIdConfig as LangIdConfig
from ._langid import lite_model_path as lite_model_path
from ._langid import predict_languages as predict_languages
from ._minhash import MinHashConfig as MinHashConfig
from ._minhash import normalize_texts as normalize_texts
from ._minhash import signatures_and_buckets as signatures_and_buckets
from ._rules import C4Rules as C4Rules
from ._rules import FineWebRules as FineWebRules
from ._rules import GopherQuality as GopherQuality
from ._rules import GopherRepetition as GopherRepetition
from ._text import normalized_words as normalized_words
from ._warc import WarcPage as WarcPage
from ._warc import iter_pages as iter_pages
from ._warc import warc_dataset as warc_dataset
from ._warc import write_warc as write_warc
