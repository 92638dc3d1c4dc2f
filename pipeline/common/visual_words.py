"""The words that name what a region looks like: colours, shapes and materials, the world's
(pipeline/world/scene.py) and the common English ones. The cross-modal test classes masked words
by them (pipeline/analyze/word_classes.py); pretraining can mask them more often than other
words (the objectives' `visual_word_mask_prob`), so that the masked LM has to read the image.
"""

from __future__ import annotations

import torch

COLOURS = frozenset({
    "red", "blue", "green", "yellow", "purple", "orange", "pink", "white", "brown", "gray",
    "grey", "black", "beige", "tan", "gold", "golden", "silver", "violet", "maroon", "navy",
})
SHAPES = frozenset({
    "ball", "box", "triangle", "ring", "star", "heart", "cross", "diamond", "circle", "square",
    "cube", "sphere", "cylinder", "cone", "disc", "disk",
})
MATERIALS = frozenset({
    "metal", "metallic", "wooden", "wood", "plastic", "glass", "stone", "leather", "rubber",
    "paper", "cardboard", "steel", "iron", "cotton", "wool", "woolen", "denim",
})


def plural(shape: str) -> str:
    """The plural of a shape word ("boxes", "balls")."""
    return shape + "es" if shape.endswith(("x", "s", "sh", "ch")) else shape + "s"


VISUAL_WORDS = COLOURS | SHAPES | MATERIALS | frozenset(plural(s) for s in SHAPES)


def visual_word_ids(tokenizer) -> torch.Tensor:
    """(K,) long: the vocabulary ids of the visual words that are one wordpiece of `tokenizer`'s
    vocabulary (a word split into pieces has no single id to mask; BERT's uncased vocabulary
    holds all but a few rare ones)."""
    vocab = tokenizer.get_vocab()
    return torch.tensor(sorted(vocab[w] for w in VISUAL_WORDS if w in vocab), dtype=torch.long)
