"""The corpus statistics table (LXMERT's Table 1, transposed): one row per source, images and
sentences per split, the totals, and the answer-table size; printed by `pipeline corpus build`."""

from __future__ import annotations


def format_table(stats: dict) -> str:
    """stats: stats.json's content. img: images with at least one sentence of the source (the
    "all" row counts each image once); sent: sentences. Every image is in exactly one split, so
    the total column is the sum of the splits."""
    splits = stats["splits"]
    sources = list(next(iter(splits.values()))["sentences"]) if splits else []
    names = [*splits, "total"]

    def row(name: str, images: list[int], sentences: list[int]) -> list[str]:
        cells = [name]
        for n_img, n_sent in zip([*images, sum(images)], [*sentences, sum(sentences)]):
            cells += [f"{n_img:,}", f"{n_sent:,}"]
        return cells

    rows = [["source"] + ["img", "sent"] * len(names)]
    for source in sources:
        rows.append(row(source, [s["images_by_source"][source] for s in splits.values()],
                        [s["sentences"][source] for s in splits.values()]))
    rows.append(row("all", [s["images"] for s in splits.values()],
                    [sum(s["sentences"].values()) for s in splits.values()]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    # A split's name spans its two columns; widen them if the name is longer.
    for k, name in enumerate(names):
        short = len(name) - (widths[1 + 2 * k] + 1 + widths[2 + 2 * k])
        if short > 0:
            widths[2 + 2 * k] += short
    lines = [" ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                      enumerate(zip(r, widths))) for r in rows]
    top = " " * widths[0] + "".join(
        " | " + name.center(widths[1 + 2 * k] + 1 + widths[2 + 2 * k])
        for k, name in enumerate(names))
    lines = [" | ".join(_pairs(line, widths)) for line in lines]
    rule = "-" * len(top)
    return "\n".join([top.rstrip(), lines[0], rule, *lines[1:-1], rule, lines[-1],
                      f"answers: {stats['answers']:,} (answers.json, from the training splits)"])


def _pairs(line: str, widths: list[int]) -> list[str]:
    """Cut a formatted row into the source cell and one "img sent" cell per split."""
    cells, start = [line[:widths[0]]], widths[0] + 1
    for k in range(1, len(widths), 2):
        end = start + widths[k] + 1 + widths[k + 1]
        cells.append(line[start:end])
        start = end + 1
    return cells
