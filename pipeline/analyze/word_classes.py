"""The word classes the cross-modal test reports on (Frank et al. 2021 report per phrase type;
the generated world's captions vary colour, shape, material and ground, so those are ours).

A word of a boxed phrase is a colour, a shape or a material when its lexicon has it (plural
shapes too: "two red balls"); otherwise the phrase's last word is its noun ("a small red
*dog*"); the phrase's other words (articles, numbers, sizes) are "other". Every content word of a
phrase of the scene (Flickr30K Entities' type "scene": "a grassy field", "the tiles") is ground,
its articles "other". The lexicons hold the world's words (pipeline/world/scene.py) and the
common English ones of each kind, so real captions are classed the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.common.visual_words import COLOURS, MATERIALS, SHAPES, plural

CLASSES = ("colour", "shape", "material", "ground", "noun", "other")

# Not a phrase's content: what the scene's phrases and a noun's modifiers begin with.
FUNCTION_WORDS = frozenset({"a", "an", "the", "some", "this", "that", "these", "those"})
_SINGULAR = {plural(shape): shape for shape in SHAPES}


def phrase_word_classes(words: Sequence[str], *, scene: bool) -> list[str]:
    """The class of each word of one phrase (module docstring); `scene`: a phrase of the scene."""
    lowered = [w.lower() for w in words]
    if scene:
        return ["other" if w in FUNCTION_WORDS else "ground" for w in lowered]
    classes = []
    for i, word in enumerate(lowered):
        if word in COLOURS:
            classes.append("colour")
        elif _SINGULAR.get(word, word) in SHAPES:
            classes.append("shape")
        elif word in MATERIALS:
            classes.append("material")
        elif i == len(lowered) - 1 and word not in FUNCTION_WORDS:
            classes.append("noun")
        else:
            classes.append("other")
    return classes
