"""Sentences built word by word with their dependency tree: the world's own gold parses.

A sentence is assembled by the code that writes it (language/flickr30k.py), which knows every
word's head and relation, so the parse is exact by construction rather than a parser's guess.
Relations and tags follow Universal Dependencies v2 (English Web Treebank conventions: "next to"
is `case` + `fixed`, "there is" is `expl` + a VERB root, a copula is `cop` under its predicate,
"metal" before a noun is a NOUN `compound`); XPOS are Penn Treebank tags.

Tokens are the sentence's words with punctuation split off ("box ." -> "box", "."), which is
how Flickr30K Entities writes its sentences; `raw` glues punctuation back on, as Karpathy's
caption files do ("... a blue box.").
"""

from __future__ import annotations

from dataclasses import dataclass

PUNCTUATION = frozenset(".,;:!?")
# Lemma, UPOS, XPOS and FEATS of closed-class words; open-class words are typed by their callers.
_CLOSED = {
    "a": ("a", "DET", "DT", "Definite=Ind|PronType=Art"),
    "an": ("a", "DET", "DT", "Definite=Ind|PronType=Art"),
    "the": ("the", "DET", "DT", "Definite=Def|PronType=Art"),
    "is": ("be", "AUX", "VBZ", "Mood=Ind|Number=Sing|Person=3|Tense=Pres|VerbForm=Fin"),
    "are": ("be", "AUX", "VBP", "Mood=Ind|Number=Plur|Person=3|Tense=Pres|VerbForm=Fin"),
    "there": ("there", "PRON", "EX", "PronType=Dem"),
    "and": ("and", "CCONJ", "CC", "_"),
    "of": ("of", "ADP", "IN", "_"),
    "to": ("to", "ADP", "IN", "_"),
    "on": ("on", "ADP", "IN", "_"),
    "above": ("above", "ADP", "IN", "_"),
    "below": ("below", "ADP", "IN", "_"),
    "among": ("among", "ADP", "IN", "_"),
    "than": ("than", "ADP", "IN", "_"),
    "next": ("next", "ADJ", "JJ", "Degree=Pos"),
    "other": ("other", "ADJ", "JJ", "Degree=Pos"),
    ".": (".", "PUNCT", ".", "_"),
}


@dataclass(frozen=True)
class ParsedWord:
    """One token of a sentence: CoNLL-U's columns but the ids. head: index of the head word in
    the sentence (0-based), -1 for the root."""

    form: str
    lemma: str
    upos: str
    xpos: str
    feats: str
    head: int
    deprel: str


@dataclass(frozen=True)
class GroundedPhrase:
    """A noun phrase of a sentence: words [start, end) and what it names. kind: "objects" (the
    scene objects `objects`, by index into Scene.objects), "scene" (the ground the picture shows)
    or "notvisual" (the picture itself: nothing to box)."""

    start: int
    end: int
    kind: str
    objects: tuple[int, ...] = ()


class SentenceBuilder:
    """Appends words left to right; heads may be set after the head word is added."""

    def __init__(self) -> None:
        self._words: list[dict] = []
        self._phrases: list[GroundedPhrase] = []

    def __len__(self) -> int:
        return len(self._words)

    def word(self, form: str, upos: str = "", xpos: str = "", feats: str = "_", *,
             lemma: str = "") -> int:
        """Add a word (closed-class words need only their form; the sentence's first word is
        capitalised here); returns its index."""
        closed = _CLOSED.get(form)
        if closed is not None and not upos:
            lemma, upos, xpos, feats = closed
        assert upos and xpos, f"open-class word {form!r} needs its tags"
        lemma = lemma or form
        if not self._words:
            form = form[0].upper() + form[1:]
        self._words.append({"form": form, "lemma": lemma, "upos": upos, "xpos": xpos,
                            "feats": feats, "head": None, "deprel": None})
        return len(self._words) - 1

    def attach(self, dependent: int, head: int, deprel: str) -> None:
        assert self._words[dependent]["head"] is None, "a word has one head"
        self._words[dependent]["head"], self._words[dependent]["deprel"] = head, deprel

    def phrase(self, start: int, kind: str, objects: tuple[int, ...] = ()) -> None:
        """Mark the words from `start` to the last one added as a phrase."""
        self._phrases.append(GroundedPhrase(start, len(self._words), kind, objects))

    def finish(self, root: int) -> tuple[tuple[ParsedWord, ...], tuple[GroundedPhrase, ...]]:
        """Close the sentence with a full stop under `root`; every word must have a head."""
        stop = self.word(".")
        self.attach(stop, root, "punct")
        self.attach(root, -1, "root")
        words = []
        for index, w in enumerate(self._words):
            assert w["head"] is not None, f"word {index} {w['form']!r} has no head"
            words.append(ParsedWord(w["form"], w["lemma"], w["upos"], w["xpos"], w["feats"],
                                    w["head"], w["deprel"]))
        return tuple(words), tuple(self._phrases)


def raw_text(forms: tuple[str, ...] | list[str]) -> str:
    """Tokens joined with single spaces, punctuation glued to the word before it."""
    text = ""
    for form in forms:
        text += form if form in PUNCTUATION or not text else " " + form
    return text
