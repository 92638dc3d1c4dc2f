"""`--show-config`: every key of a resolved config, its value and its meaning, read from the
docstring of the dataclass that holds it.

The config classes document their fields in prose, `name: meaning. other / names: meaning.`
(several names may share one meaning: `actors, gpus_per_actor, decoders: ...`); a field named in
no such entry gets the first sentence before the entries that mentions it, else the first
entry that does, else nothing.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap
from typing import Any

import yaml

from pipeline.common.config import plain

# A docstring entry's head: one or more names joined by ", ", " / " or " and ", then ": ".
_HEAD = re.compile(r"(?<![\w.`])((?:[a-z_][a-z0-9_]*(?:, | / | and ))*[a-z_][a-z0-9_]*): ")
_JOINS = re.compile(r", | / | and ")  # between the names of one head


def meanings(cls: type) -> dict[str, str]:
    """Field name -> the docstring's text about it, one line (empty when it says nothing); a
    dataclass that extends another says its own fields, its bases' docstrings the rest."""
    fields = {f.name for f in dataclasses.fields(cls)}
    found: dict[str, str] = {}
    preambles: list[str] = []
    for doc in [c.__doc__ for c in cls.__mro__ if dataclasses.is_dataclass(c) and c.__doc__]:
        doc = " ".join(inspect.cleandoc(doc).split())
        heads = [m for m in _HEAD.finditer(doc)
                 if set(_JOINS.split(m.group(1))) <= fields]
        for head, after in zip(heads, [*heads[1:], None]):
            text = doc[head.end(): after.start() if after else len(doc)].strip()
            for name in _JOINS.split(head.group(1)):
                found.setdefault(name, text)
        preambles.append(doc[: heads[0].start()] if heads else doc)
    # Other entries mention fields too ("a checkpoint in `init` must hold it"): the text before
    # the first entry speaks of the fields it names, an entry only perhaps.
    sentences = [s for preamble in preambles for s in re.split(r"(?<=\.) ", preamble)]
    entries = list(found.values())
    for name in fields - found.keys():
        mention = re.compile(rf"(?<![\w.]){re.escape(name)}(?!\w)")
        found[name] = next((s for s in sentences + entries if mention.search(s)), "")
    return found


def describe(config: Any, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted key, value, meaning) for every leaf field of `config`, in declaration order."""
    rows = []
    about = meanings(type(config))
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        key = f"{prefix}{field.name}"
        if dataclasses.is_dataclass(value):
            rows += describe(value, f"{key}.")
        else:
            rows.append((key, plain(value), about[field.name]))
    return rows


def show_config(config: Any, width: int = 100) -> str:
    """The `--show-config` text: `key: value` (as `--set` takes it) and the meaning below it."""
    lines = []
    for key, value, meaning in describe(config):
        shown = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
        shown = shown.removesuffix("\n...").removesuffix("...").strip()
        lines.append(f"{key}={shown}")
        if meaning:
            lines += textwrap.wrap(meaning, width, initial_indent="    ",
                                   subsequent_indent="    ")
    return "\n".join(lines)
