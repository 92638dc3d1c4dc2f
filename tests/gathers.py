"""For the objective tests: the masked tokens of a batch travel as a fixed-size gather
(inputs["mlm_index"] (M,) into the B * T tokens, targets[...] (M,) labels, IGNORE_INDEX in the
padding: PretrainObjective.masked_tokens); these give back the (B, T) views the tests check."""

import torch

from model.heads import IGNORE_INDEX


def dense_labels(batch, key: str = "mlm_labels") -> torch.Tensor:
    """(B, T) long: the gathered labels at their tokens, IGNORE_INDEX elsewhere."""
    B, T = batch.inputs["input_ids"].shape
    labels = batch.targets[key]
    kept = labels != IGNORE_INDEX
    dense = torch.full((B * T,), IGNORE_INDEX, dtype=torch.long)
    dense[batch.inputs["mlm_index"][kept]] = labels[kept]
    return dense.view(B, T)


def check_gather(batch, keys: tuple[str, ...] = ("mlm_labels",)) -> None:
    """The gather's layout: the labelled tokens first, in row-major order and each once, then
    padding (index 0, IGNORE_INDEX in every key); labelled exactly where the index is."""
    index = batch.inputs["mlm_index"]
    labelled = torch.stack([batch.targets[k] != IGNORE_INDEX for k in keys]).any(0)  # (M,)
    count = int(labelled.sum())
    assert labelled[:count].all() and not labelled[count:].any()
    assert (index[:count].diff() > 0).all() and not index[count:].any()


def every_token(batch, keys: tuple[str, ...] = ("mlm_labels",)):
    """The same batch with every one of its B * T tokens gathered (the full-vocabulary scoring
    the gather stands in for), labelled as before."""
    B, T = batch.inputs["input_ids"].shape
    targets = {**batch.targets, **{k: dense_labels(batch, k).flatten() for k in keys}}
    inputs = {**batch.inputs, "mlm_index": torch.arange(B * T)}
    return type(batch)(inputs=inputs, targets=targets, size=batch.size)


def chosen_regions(batch) -> torch.Tensor:
    """(R, N) bool: the regions gathered at targets["region_index"] with weight 1."""
    R, N = batch.inputs["features"].shape[:2]
    valid = batch.targets["region_weight"] > 0
    chosen = torch.zeros(R * N, dtype=torch.bool)
    chosen[batch.targets["region_index"][valid]] = True
    return chosen.view(R, N)
