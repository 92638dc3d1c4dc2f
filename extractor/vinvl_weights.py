"""VinVL's checkpoints (maskrcnn_benchmark's layout, e.g. `vinvl_vg_x152c4.pth`) -> our names.

Their Checkpointer saves `{"model": state_dict, "optimizer", "scheduler", "iteration"}` (a file may
hold "model" alone), names prefixed `module.` where the model was wrapped for distributed
training. Names (AttrRCNN, maskrcnn_benchmark/modeling/backbone/resnet.py):
- `backbone.body.stem.conv1` / `.bn1`; `backbone.body.layer{1,2,3}.{i}.conv{1,2,3}` / `.bn{1,2,3}`
  / `.downsample.{0,1}` are our res2..res4 (`conv*.norm`, `shortcut`);
  `roi_heads.box.feature_extractor.head.layer4.{i}...` is our `roi_heads.res5`.
- `attribute.feature_extractor.*`: the same res5 again (SHARE_BOX_FEATURE_EXTRACTOR makes it the
  box head's module, so its state dict repeats every tensor): each must equal the box head's.
- `rpn.head.{conv,cls_logits,bbox_pred}`, `rpn.anchor_generator.cell_anchors.0`.
- `roi_heads.box.predictor.cls_score` / `attribute.predictor.cls_embedding` rows and
  `attribute.predictor.attr_score` rows start with background / "no attribute": moved last, our
  order; `roi_heads.box.predictor.bbox_pred` has 4 background rows first: dropped.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from extractor.config import BLOCKS_PER_STAGE
from extractor.errors import WeightsError

_STAGES = {"layer1": "backbone.res2", "layer2": "backbone.res3", "layer3": "backbone.res4"}
_RES5 = "roi_heads.box.feature_extractor.head.layer4."
_ATTR_RES5 = "attribute.feature_extractor."
_BOX_EXTRACTOR = "roi_heads.box.feature_extractor."
_RENAMED = {
    "rpn.head.conv.": "proposal_generator.rpn_head.conv.",
    "rpn.head.cls_logits.": "proposal_generator.rpn_head.objectness_logits.",
    "rpn.head.bbox_pred.": "proposal_generator.rpn_head.anchor_deltas.",
    "rpn.anchor_generator.": "proposal_generator.anchor_generator.",
    "roi_heads.box.predictor.cls_score.": "roi_heads.box_predictor.cls_score.",
    "roi_heads.box.predictor.bbox_pred.": "roi_heads.box_predictor.bbox_pred.",
    "attribute.predictor.": "roi_heads.box_predictor.",
}
# Rows whose first entry is background / "no attribute" (ours is last).
_FIRST_ROW_LAST = ("roi_heads.box_predictor.cls_score.", "roi_heads.box_predictor.cls_embedding.",
                   "roi_heads.box_predictor.attr_score.")


def is_vinvl_layout(state: Mapping[str, object]) -> bool:
    """Whether a state dict (or a Checkpointer's {"model": ...}) is in maskrcnn_benchmark's names."""
    state = state.get("model", state) if isinstance(state.get("model"), Mapping) else state
    return any(name.removeprefix("module.").startswith("backbone.body.") for name in state)


def _block(name: str) -> str:
    """A bottleneck's tensor name inside a stage: bnK -> convK.norm, downsample -> shortcut."""
    index, module, rest = name.split(".", 2)
    if module.startswith("bn"):
        module = f"conv{module[2:]}.norm"
    elif module == "downsample":
        which, rest = rest.split(".", 1)
        module = "shortcut" if which == "0" else "shortcut.norm"
    return f"{index}.{module}.{rest}"


def _our_name(name: str) -> str:
    """Our name of a maskrcnn_benchmark tensor name (`module.` removed); unknown names pass."""
    if name.startswith("backbone.body.stem."):
        rest = name.removeprefix("backbone.body.stem.")
        return "backbone.stem." + ("conv1.norm." + rest[4:] if rest.startswith("bn1.") else rest)
    if name.startswith("backbone.body.layer"):
        stage, rest = name.removeprefix("backbone.body.").split(".", 1)
        return f"{_STAGES.get(stage, stage)}.{_block(rest)}"
    if name.startswith(_RES5):
        return "roi_heads.res5." + _block(name.removeprefix(_RES5))
    for theirs, ours in _RENAMED.items():
        if name.startswith(theirs):
            return ours + name.removeprefix(theirs)
    return name


def from_vinvl(path: object, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our {name: tensor} of a VinVL checkpoint's state dict (`module.` prefixes allowed).

    WeightsError where the attribute head's copy of res5 differs from the box head's (they are
    one module in the authors' model)."""
    state = {name.removeprefix("module."): t for name, t in state.items()}
    ours: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.startswith(_ATTR_RES5):
            twin = _BOX_EXTRACTOR + name.removeprefix(_ATTR_RES5)
            if twin not in state or not torch.equal(state[twin], tensor):
                raise WeightsError(
                    f"{path}: {name} is not a copy of {twin}: the attribute head's res5 must be "
                    "the box head's (SHARE_BOX_FEATURE_EXTRACTOR)")
            continue
        our = _our_name(name)
        if our.startswith(_FIRST_ROW_LAST):
            tensor = torch.cat((tensor[1:], tensor[:1]))
        elif our.startswith("roi_heads.box_predictor.bbox_pred."):
            tensor = tensor[4:]
        ours[our] = tensor
    return ours


def vinvl_fields(state: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """The DetectorConfig fields a VinVL state dict (our names) fixes by its tensors' shapes:
    depth (blocks per stage), width, groups and width_per_group (res2's grouped 3x3), the
    classes, attributes and head widths. WeightsError where a tensor it reads is missing."""
    blocks = {stage: {int(n.split(".")[2]) for n in state if n.startswith(f"backbone.{stage}.")}
              for stage in ("res2", "res3", "res4")}
    blocks["res5"] = {int(n.split(".")[2]) for n in state if n.startswith("roi_heads.res5.")}
    counts = tuple(len(blocks[s]) for s in ("res2", "res3", "res4", "res5"))
    depths = [d for d, per in BLOCKS_PER_STAGE.items() if per == counts and d >= 50]
    if not depths:
        raise WeightsError(f"blocks per stage {counts} are no ResNeXt depth of "
                           f"{sorted(d for d in BLOCKS_PER_STAGE if d >= 50)}")
    try:
        conv2 = state["backbone.res2.0.conv2.weight"]
        fields = {
            "depth": depths[0],
            "width": int(state["backbone.stem.conv1.weight"].shape[0]),
            "groups": int(conv2.shape[0] // conv2.shape[1]),
            "width_per_group": int(conv2.shape[1]),
            "rpn_hidden": int(state["proposal_generator.rpn_head.conv.weight"].shape[0]),
            "num_classes": int(state["roi_heads.box_predictor.cls_score.weight"].shape[0]) - 1,
            "num_attributes": int(state["roi_heads.box_predictor.attr_score.weight"].shape[0]) - 1,
            "attr_embed_dim": int(state["roi_heads.box_predictor.cls_embedding.weight"].shape[1]),
            "attr_hidden": int(state["roi_heads.box_predictor.fc_attr.weight"].shape[0]),
        }
    except KeyError as err:
        raise WeightsError(f"a VinVL checkpoint without {err.args[0]} (our name)") from None
    return fields
