"""VL-BERT with the authors' structure (layout="official") against what their code produced, and
their released-file layout read, converted and written back (model/checkpoints/vlbert.py).

References (tests/references/vlbert/), made by the authors' code and nothing of ours:
- repository jackroos/VL-BERT, commit 4373674cbf2bcd6c09a2c26abfdb6705b870e3be;
- class `pretrain.modules.ResNetVLBERTForPretrainingMultitask` (their
  `VisualLinguisticBertForPretraining` inside), config `pretrain/function/config.py` defaults
  with IMAGE_FEAT_PRECOMPUTED true, IMAGE_FINAL_DIM 16, WITH_REL_LOSS false, WITH_MLM_LOSS /
  WITH_MVRC_LOSS true, *_LOSS_NORM_IN_BATCH_FIRST false, and VLBERT = `TINY_CFG` below (hidden
  16, 2 layers, 2 heads, FFN 32, 32 positions, vocab 40, 9 region classes, with_pooler true,
  visual_ln true);
- two widths their code hard-codes shrunk for size: the appearance feature 2048 -> 64 (the
  Linear(2 * 2048, ...) of `common/fast_rcnn.py` and `object_mask_visual_embedding`) and the
  geometry 256 per coordinate -> 8 (so G = 64); torchvision's RoIAlign for their compiled op
  (unused with precomputed features); float32, eval mode (no dropout), CPU;
- weights: `torch.manual_seed(0)` at construction (their init), then every LayerNorm, bias,
  visual LayerNorm and masked appearance redrawn from `torch.Generator().manual_seed(1)`
  (N(0, 0.25), gains around 1) so no path is zero;
- `pretraining.model`: `torch.save({"epoch", "optimizer", "state_dict"})` with DataParallel's
  `module.` names, as their checkpoint callback writes it (optimizer state empty);
- `pretraining_io.safetensors`: their inputs, `text` (2, 6) token ids (row 2 padded with 0),
  `boxes` (2, 4, 4 + 64) absolute x1 y1 x2 y2 then the appearance, box 0 the whole image
  [0, 0, W - 1, H - 1] with the mean feature (their ADD_IMAGE_AS_A_BOX), row 2 with 3 real
  boxes (padding -2), `im_info` (2, 4) W = 64, H = 32, `mvrc_ops` (2, 4) (one masked RoI a row),
  `mvrc_labels` (2, 4, 9) soft targets, `mlm_labels` (2, 6) (-1 = none), and one text-only row
  `aux_text` (1, 7) with `aux_mlm_labels`; their outputs, caught by forward hooks:
  `text_hidden` (3, 7, 16) (the mlm head's input), `object_hidden` (3, 4, 16) (the mvrc head's),
  `pooled` (3, 16); returned: `mlm_logits_wvc` (2, 7, 40), `mlm_logits_aux` (1, 7, 40),
  `mvrc_logits` (2, 4, 9), `mlm_loss_wvc`, `mlm_loss_aux`, `mvrc_loss` and the total `loss`.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from model.checkpoints import formats
from model.checkpoints import vlbert as vl
from model.checkpoints.common import read_released
from model.errors import CheckpointError
from model.heads import IGNORE_INDEX, masked_lm_loss, soft_cross_entropy, vqa_bce_loss
from model.vlbert import VlBertConfig, VlBertModel
from model.vlbert_pretraining import VlBertForPreTraining
from model.vlbert_tasks import (
    VlBertForMultipleChoice,
    VlBertForQuestionAnswering,
    VlBertForReferringExpressions,
)

REFERENCES = Path(__file__).parent / "references" / "vlbert"
TINY_CFG = """\
NETWORK:
  IMAGE_FEAT_PRECOMPUTED: true
  IMAGE_FINAL_DIM: 16
  VLBERT:
    with_pooler: true
    visual_size: 16
    hidden_size: 16
    num_hidden_layers: 2
    num_attention_heads: 2
    intermediate_size: 32
    hidden_act: "gelu"
    hidden_dropout_prob: 0.1
    attention_probs_dropout_prob: 0.1
    max_position_embeddings: 32
    type_vocab_size: 3
    vocab_size: 40
    initializer_range: 0.02
    visual_ln: true
    visual_region_classes: 9
"""
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return load_file(REFERENCES / "pretraining_io.safetensors")


@pytest.fixture(scope="module")
def cfg_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "tiny.yaml"
    path.write_text(TINY_CFG)
    return path


def read(cfg_file: Path | None, *, drop_heads: bool = False) -> tuple:
    raw, _ = read_released(REFERENCES / "pretraining.model")
    notes: list[str] = []
    config, state, model = vl.read_official(raw, config_file=cfg_file, drop_heads=drop_heads,
                                            notes=notes)
    return config, state, model, notes


def batch(io: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Their inputs in our layout: the 2 caption rows then the text-only row, boxes normalised."""
    text, aux, boxes = io["input.text"], io["input.aux_text"], io["input.boxes"]
    B, N = boxes.shape[:2]
    T = max(text.shape[1], aux.shape[1])
    ids = torch.zeros(B + 1, T, dtype=torch.long)
    ids[:B, :text.shape[1]] = text
    ids[B, :aux.shape[1]] = aux[0]
    wh = io["input.im_info"][:, None, :2].repeat(1, 1, 2)
    features = torch.zeros(B + 1, N, boxes.shape[-1] - 4)
    features[:B] = boxes[..., 4:]
    boxes_norm = torch.zeros(B + 1, N, 4)
    boxes_norm[:B] = boxes[..., :4] / wh
    region_mask = torch.zeros(B + 1, N, dtype=torch.bool)
    region_mask[:B] = boxes[..., 0] > -1.5
    masked = torch.zeros(B + 1, N, dtype=torch.bool)
    masked[:B] = io["input.mvrc_ops"] == 1
    return dict(input_ids=ids, attention_mask=(ids > 0).long(), token_type_ids=None,
                features=features, boxes=boxes_norm, region_mask=region_mask,
                masked_regions=masked)


def errors(ours: torch.Tensor, theirs: torch.Tensor) -> tuple[float, float]:
    diff = (ours - theirs).abs()
    return diff.max().item(), (diff / theirs.abs().clamp_min(1e-6)).max().item()


def test_their_pretraining_model_equals_ours_on_every_output_and_loss(reference, cfg_file):
    config, state, model_name, _ = read(cfg_file)
    assert model_name == "VlBertForPreTraining"
    model = VlBertForPreTraining(config).eval()
    model.load_state_dict(state, strict=True)
    inputs = batch(reference)
    with torch.no_grad():
        out = model(**inputs)
    text = inputs["attention_mask"].bool()
    regions = inputs["region_mask"]
    B = 2  # caption rows; the third is the text-only one
    labels = torch.full(text.shape, IGNORE_INDEX)
    labels[:B, :6] = reference["input.mlm_labels"].masked_fill(reference["input.mlm_labels"] < 0,
                                                              IGNORE_INDEX)
    aux_labels = reference["input.aux_mlm_labels"][0]
    labels[B, :7] = aux_labels.masked_fill(aux_labels < 0, IGNORE_INDEX)
    logits = out.lang_prediction_logits
    masked = inputs["masked_regions"][:B]
    loss_mlm = masked_lm_loss(logits[:B], labels[:B])
    loss_text = masked_lm_loss(logits[B:], labels[B:])
    loss_mvrc = soft_cross_entropy(out.region_class_logits[:B], reference["input.mvrc_labels"],
                                   masked.float())
    pairs = {
        "text hidden": (out.text_hidden[text], reference["output.text_hidden"][text]),
        "region hidden": (out.visual_hidden[regions], reference["output.object_hidden"][regions]),
        "pooled": (out.pooled, reference["output.pooled"]),
        "MLM logits (captions)": (logits[:B][text[:B]],
                                  reference["output.mlm_logits_wvc"][text[:B]]),
        "MLM logits (text-only)": (logits[B:][text[B:]],
                                   reference["output.mlm_logits_aux"][text[B:]]),
        "masked RoI logits": (out.region_class_logits[:B][regions[:B]],
                              reference["output.mvrc_logits"][regions[:B]]),
        "loss mlm_wvc": (loss_mlm, reference["output.mlm_loss_wvc"]),
        "loss mlm_aux": (loss_text, reference["output.mlm_loss_aux"]),
        "loss mvrc": (loss_mvrc, reference["output.mvrc_loss"]),
        "loss total": (loss_mlm + loss_text + loss_mvrc, reference["output.loss"]),
    }
    for name, (ours, theirs) in pairs.items():
        assert ours.shape == theirs.shape, name
        abs_err, rel_err = errors(ours, theirs)
        print(f"{name}: max abs {abs_err:.2e}, max rel {rel_err:.2e}")
        assert abs_err <= TOLERANCE, name


def test_the_file_reads_off_its_shapes_without_a_config(cfg_file):
    inferred, state, _, notes = read(None)
    from_cfg = read(cfg_file)[0]
    # the one thing the weights do not record is the head count (hidden / 64 assumed)
    assert dataclasses.replace(inferred, num_heads=2) == from_cfg
    assert any("num_heads" in n for n in notes)
    widths = (from_cfg.visual_feat_dim, from_cfg.geometry_dim, from_cfg.num_region_classes)
    assert widths == (64, 64, 9)


def test_encoder_alone_with_drop_heads_and_written_back_to_their_names(cfg_file):
    raw, _ = read_released(REFERENCES / "pretraining.model")
    config, state, model_name, notes = read(cfg_file, drop_heads=True)
    assert model_name == "VlBertModel"
    assert any("dropped the heads" in n for n in notes)
    VlBertModel(config).load_state_dict(state, strict=True)
    # the whole pretraining model round-trips to exactly the file's tensors
    config, state, model_name, _ = read(cfg_file)
    written = vl.write_official(config, state, model_name)
    assert set(written) == set(raw)
    for name, t in written.items():
        assert torch.equal(t, raw[name]), name


def test_seam_converts_their_file_to_ours_and_back(cfg_file, tmp_path):
    """Through model.checkpoints' seam (formats.OFFICIAL)."""
    source = REFERENCES / "pretraining.model"
    ckpt = formats.load_checkpoint(source, config_file=cfg_file)
    assert (ckpt.arch, ckpt.report.model) == ("vlbert", "VlBertForPreTraining")
    assert ckpt.report.heads == ("mlm_head", "region_head")
    formats.build_model(ckpt)
    ours = formats.load_checkpoint(formats.save_ours(tmp_path / "ours", "vlbert", ckpt.config,
                                                     ckpt.state_dict))
    assert ours.config == ckpt.config and ours.report.model == "VlBertForPreTraining"
    back = formats.save_official(tmp_path / "back.model", "vlbert", ours.config, ours.state_dict)
    written, raw = torch.load(back, weights_only=True)["state_dict"], read_released(source)[0]
    assert written.keys() == raw.keys()
    assert all(torch.equal(written[n], raw[n]) for n in raw)


def test_files_of_the_other_layouts_and_errors(cfg_file):
    raw, _ = read_released(REFERENCES / "pretraining.model")
    assert vl.looks_like(raw) and vl.looks_like([n.removeprefix("module.") for n in raw])
    assert not vl.looks_like(["bert.embeddings.word_embeddings.weight", "cls.predictions.bias"])
    # a fine-tuned file: no pretraining rows, a task head, and (end to end) the CNN
    tuned = {n: t for n, t in raw.items() if not any(k in n for k in (
        "mlm_head", "mvrc_head", "object_mask_word", "aux_text", "object_mask_visual"))}
    tuned["module.final_mlp.2.weight"] = torch.zeros(5, 16)
    tuned["module.image_feature_extractor.backbone.conv1.weight"] = torch.zeros(4, 3, 7, 7)
    config = read(cfg_file)[0]  # the shrunk appearance width is not in a file without the mask
    with pytest.raises(CheckpointError, match="final_mlp"):
        vl.read_with_config(tuned, config, drop_heads=False, notes=[])
    notes: list[str] = []
    config, state, model_name = vl.read_with_config(tuned, config, drop_heads=True, notes=notes)
    assert model_name == "VlBertModel"
    VlBertModel(config).load_state_dict(state, strict=True)
    assert any("Fast R-CNN" in n for n in notes) and any("object_mask_word" in n for n in notes)
    # strict: every missing, unexpected and mis-shaped tensor named as the file names it
    broken = dict(raw)
    del broken["module.vlbert.end_embedding.weight"]
    broken["module.vlbert.extra.weight"] = torch.zeros(1)
    broken["module.vlbert.encoder.layer.0.intermediate.dense.weight"] = torch.zeros(33, 16)
    with pytest.raises(CheckpointError) as err:
        vl.read_official(broken, config_file=cfg_file, drop_heads=False, notes=[])
    message = str(err.value)
    for name in ("missing: module.vlbert.end_embedding.weight", "unexpected: module.vlbert.extra",
                 "wrong shape: module.vlbert.encoder.layer.0.intermediate.dense.weight"):
        assert name in message
    with pytest.raises(CheckpointError, match="layout='official'"):
        vl.write_official(VlBertConfig.tiny(), VlBertModel(VlBertConfig.tiny()).state_dict(),
                          "VlBertModel")


def test_official_layout_text_only_rows_and_padding():
    """Text-only rows take the learned vector; padding changes no real output."""
    config = dataclasses.replace(VlBertConfig.official(), hidden_size=32, num_layers=1,
                                 num_heads=2, intermediate_size=64, vocab_size=50,
                                 max_position_embeddings=32, visual_feat_dim=16, geometry_dim=16)
    model = VlBertModel(config).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 50, (1, 4), generator=g)
    feats, boxes = torch.rand(1, 3, 16, generator=g), torch.rand(1, 3, 4, generator=g)
    with torch.no_grad():
        alone = model(input_ids=ids, attention_mask=None, token_type_ids=None, features=feats,
                      boxes=boxes, region_mask=None)
        padded = model(input_ids=torch.cat([ids, torch.zeros(1, 2, dtype=torch.long)], 1),
                       attention_mask=torch.tensor([[1, 1, 1, 1, 0, 0]]), token_type_ids=None,
                       features=torch.cat([feats, torch.full((1, 1, 16), float("nan"))], 1),
                       boxes=torch.cat([boxes, torch.zeros(1, 1, 4)], 1),
                       region_mask=torch.tensor([[1, 1, 1, 0]]))
        text_only = model(input_ids=ids, attention_mask=None, token_type_ids=None,
                          features=feats[:, :0], boxes=boxes[:, :0], region_mask=None)
        no_regions = model(input_ids=ids, attention_mask=None, token_type_ids=None,
                           features=feats, boxes=boxes, region_mask=torch.zeros(1, 3))
    torch.testing.assert_close(padded.text_hidden[:, :4], alone.text_hidden)
    torch.testing.assert_close(padded.visual_hidden[:, :3], alone.visual_hidden)
    assert alone.pooled is None
    torch.testing.assert_close(no_regions.text_hidden, text_only.text_hidden)
    with pytest.raises(ValueError, match="region 0"):
        model(input_ids=ids, attention_mask=None, token_type_ids=None, features=feats,
              boxes=boxes, region_mask=None, image_feature=feats[:, 0])
    with pytest.raises(ValueError, match="cxcywh"):
        dataclasses.replace(VlBertConfig.official(), geometry_box_format="xyxy")


TASK_CFG = """\
NETWORK:
  IMAGE_FEAT_PRECOMPUTED: true
  IMAGE_FINAL_DIM: 16
  VLBERT:
    visual_size: 16
    hidden_size: 16
    num_hidden_layers: 2
    num_attention_heads: 2
    intermediate_size: 32
    hidden_act: "gelu"
    hidden_dropout_prob: 0.1
    attention_probs_dropout_prob: 0.1
    max_position_embeddings: 32
    type_vocab_size: 3
    vocab_size: 40
    visual_ln: true
"""


@pytest.mark.parametrize("task", ["vqa", "refcoco"])
def test_their_fine_tuned_models_equal_ours(task, tmp_path):
    """References `vqa.model` / `refcoco.model` and `*_io.safetensors`: their `vqa.modules` and
    `refcoco.modules` `ResNetVLBERT` (same repository and commit as above) with their
    `{vqa,refcoco}/function/config.py` defaults, IMAGE_FEAT_PRECOMPUTED true, with_pooler false,
    VLBERT = `TASK_CFG` (hidden 16, 2 layers, 2 heads, FFN 32, 32 positions, vocab 40), VQA:
    CLASSIFIER_TYPE "mlm", 7 answers, CLASSIFIER_DROPOUT 0.1; RefCOCO+: CLASSIFIER_DROPOUT 0.0; the
    same shrunk widths (appearance 64, geometry 64). Their `init_weight` (which loads BERT's MLM
    transform or a ResNet from disk) skipped; `torch.manual_seed(0)` at construction, then every
    parameter redrawn from `torch.Generator().manual_seed(1)` (N(0, 0.1) matrices, N(0, 0.25)
    vectors, gains around 1). Inputs: the same 2 images (4 and 3 boxes, box 0 the whole image) as
    the pretraining reference; words (2, 4) with padding; their text as built by their
    `prepare_text_from_qa` (`[CLS] q [SEP] [MASK] [SEP]`, the answer segment B) or
    `[CLS] expression [SEP]`, caught entering their `VisualLinguisticBert`; VQA soft scores (2, 7),
    RefCOCO+ labels (2, 4). Outputs of their `train_forward` in eval mode: `label_logits` and the
    loss (BCE x answers; BCE over the real regions)."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(TASK_CFG)
    raw, _ = read_released(REFERENCES / f"{task}.model")
    io = load_file(REFERENCES / f"{task}_io.safetensors")
    # widths their code hard-codes (so no file records them) and were shrunk: our config says them
    with pytest.raises(CheckpointError, match="read_with_config"):
        vl.read_official(raw, config_file=cfg, drop_heads=False, notes=[])
    config = dataclasses.replace(vl.config_from_authors(cfg), visual_feat_dim=64, geometry_dim=64,
                                 pooler=False)
    config, state, model_name = vl.read_with_config(raw, config, drop_heads=False, notes=[])
    classes = {"vqa": VlBertForQuestionAnswering, "refcoco": VlBertForReferringExpressions}
    assert model_name == classes[task].__name__
    model = classes[task](config).eval()
    model.load_state_dict(state, strict=True)
    boxes = io["input.boxes"]
    wh = io["input.im_info"][:, None, :2].repeat(1, 1, 2)
    region_mask = boxes[..., 0] > -1.5
    with torch.no_grad():
        logits = model(input_ids=io["input.text_ids"], attention_mask=io["input.text_mask"],
                       token_type_ids=io["input.token_type_ids"], features=boxes[..., 4:],
                       boxes=boxes[..., :4] / wh, region_mask=region_mask)
    label, theirs = io["input.label"], io["output.logits"]
    if task == "vqa":
        loss = vqa_bce_loss(logits, label)
    else:
        logits, theirs = logits[region_mask], theirs[region_mask]
        loss = F.binary_cross_entropy_with_logits(logits, label[region_mask])
    for name, ours, ref in (("logits", logits, theirs), ("loss", loss, io["output.loss"])):
        abs_err, rel_err = errors(ours, ref)
        print(f"{task} {name}: max abs {abs_err:.2e}, max rel {rel_err:.2e}")
        assert abs_err <= TOLERANCE, name
    assert vl.write_official(config, state, model_name).keys() == raw.keys()


RELEASED = {  # their cfg -> (our class, hidden, layers)
    "pretrain/base_prec_4x16G_fp32": ("VlBertForPreTraining", 768, 12),
    "pretrain/base_e2e_16x16G_fp16": ("VlBertForPreTraining", 768, 12),
    "pretrain/large_e2e_16x16G_fp16": ("VlBertForPreTraining", 1024, 24),
    "vqa/base_4x16G_fp32": ("VlBertForQuestionAnswering", 768, 12),
    "refcoco/base_detected_regions_4x16G": ("VlBertForReferringExpressions", 768, 12),
    "vcr/base_q2a_4x16G_fp32": ("VlBertForMultipleChoice", 768, 12),
}


@pytest.mark.parametrize("name", RELEASED)
def test_the_released_layouts_load_strictly_off_their_shapes(name):
    """Reference `released_shapes.json.gz`: the tensor names and shapes of the models behind the
    released files, as their code builds them (same repository and commit as above; the module
    each cfg names, `cfgs/<name>.yaml` read by their `update_config`, built on the meta device with
    their pretrained-weight loading switched off; nothing shrunk). Each is read as its file would
    be (`module.` names) with no cfg: the shapes give the config, strictly."""
    with gzip.open(REFERENCES / "released_shapes.json.gz", "rt") as f:
        shapes = json.load(f)[name]
    model_name, hidden, layers = RELEASED[name]
    raw = {f"module.{n}": torch.empty(s, device="meta") for n, s in shapes.items()}
    notes: list[str] = []
    config, state, found = vl.read_official(raw, config_file=None, drop_heads=False, notes=notes)
    assert found == model_name
    sizes = (config.hidden_size, config.num_layers, config.num_heads)
    assert sizes == (hidden, layers, hidden // 64)
    assert (config.visual_feat_dim, config.geometry_dim) == (2048, 2048)
    assert state.keys() == vl.shapes_of(vl.MODELS[found], config).keys()
    if "e2e" in name or name.startswith(("refcoco", "vcr")):
        assert any("Fast R-CNN" in n for n in notes)
    # written back: the file's tensors but the CNN; as precomputed features need it, their
    # masked appearance too (which an end-to-end file lacks)
    written = set(vl.write_official(config, state, found))
    kept = {n for n in raw if not vl.fast_rcnn_tensors({n: raw[n]})}
    assert kept <= written and written - kept <= {"module.object_mask_visual_embedding.weight"}
    encoder = vl.read_official(raw, config_file=None, drop_heads=True, notes=[])
    assert encoder[2] == "VlBertModel"


def test_their_fast_rcnn_maps_onto_our_detector():
    """Their end-to-end file's CNN (the base e2e names and shapes of `released_shapes.json.gz`)
    is exactly a BUTDDetector's trunk and res5 (extractor/detector.py, default config)."""
    from extractor.config import DetectorConfig
    from extractor.detector import BUTDDetector

    with gzip.open(REFERENCES / "released_shapes.json.gz", "rt") as f:
        shapes = json.load(f)["pretrain/base_e2e_16x16G_fp16"]
    raw = {f"module.{n}": torch.empty(s, device="meta") for n, s in shapes.items()}
    with torch.device("meta"):
        detector = BUTDDetector(DetectorConfig())
    ours = {n: tuple(t.shape) for n, t in detector.state_dict().items()
            if n.startswith(("backbone.", "roi_heads.res5."))}
    mapped = {n: tuple(t.shape) for n, t in vl.fast_rcnn_as_detector(raw).items()}
    assert mapped == ours


def test_their_fast_rcnn_head_equals_our_res5_on_the_same_rois():
    """Reference `res5_head.safetensors`, from their `common/fast_rcnn.py` head (same repository
    and commit): `ResNet._make_layer(Bottleneck, planes=8, blocks=3, stride=1, dilation=2,
    stride_in_1x1=True)` on 16 input channels (their IMAGE_C5_DILATED res5 at 1/64 of its width:
    planes 512 -> 8), `torch.manual_seed(0)` convolutions, BatchNorm statistics and affines from
    `torch.Generator().manual_seed(1)` (eval mode); their ROIAlign((14, 14), 1 / 16) (sampling
    ratio 1) with torchvision's roi_align (aligned=False) standing in for the compiled op, then
    AvgPool2d(14) and Flattener. Inputs: a res4 map (1, 16, 8, 10) in [0, 1), 3 RoIs (batch index,
    x1 y1 x2 y2 in input pixels); output: features (3, 32). The weights are stored in the file's
    names (`module.image_feature_extractor.roi_head_feature_extractor.*`)."""
    from extractor.backbone import build_res5_head
    from extractor.front_end import ROI_ALIGN_ALIGNED, ROI_ALIGN_SAMPLING_RATIO
    from torchvision.ops import roi_align

    ref = load_file(REFERENCES / "res5_head.safetensors")
    res5 = build_res5_head(101, 1, 2).eval()
    mapped = vl.fast_rcnn_as_detector({n: t for n, t in ref.items() if n.startswith("module.")})
    res5.load_state_dict({n.removeprefix("roi_heads.res5."): t for n, t in mapped.items()},
                         strict=True)
    rois = ref["input.rois"]
    pooled = roi_align(ref["input.res4"], [rois[:, 1:]], (14, 14), 1 / 16,
                       ROI_ALIGN_SAMPLING_RATIO, ROI_ALIGN_ALIGNED)
    with torch.no_grad():
        features = res5(pooled).mean(dim=(2, 3))
    abs_err, rel_err = errors(features, ref["output.features"])
    print(f"res5 region features: max abs {abs_err:.2e}, max rel {rel_err:.2e}")
    assert abs_err <= TOLERANCE


def test_their_vcr_model_equals_ours(tmp_path):
    """References `vcr.model` / `vcr_io.safetensors`: their `vcr.modules.ResNetVLBERT` (same
    repository and commit), `vcr/function/config.py` defaults (question then answer, words
    grounded to objects by their tags), CLASSIFIER_TYPE "1fc" (dropout 0.1), ENABLE_CNN_REG_LOSS
    and CNN_LOSS_TOP true (their released cfgs), IMAGE_SEMANTIC false, VLBERT = `TASK_CFG` with
    with_pooler true; the same shrunk widths and seeds as the VQA reference. Their VCR model takes
    no precomputed features, so its FastRCNN call was given them (`input.features`, (2, 4, 64)) in
    the precomputed layout: only obj_downsample runs. Inputs: 2 images (box 0 the whole image,
    the second with 3 real boxes, padding -1), 3 answers each; their text (`[CLS] q [SEP] a
    [SEP]`, the answer segment B) and each word's tag (0: the image, i + 1: object i) caught in
    their forward: `text_ids`, `token_type_ids`, `text_mask`, `text_tags` (2, 3, 10). Outputs:
    `label_logits` (2, 3) of `inference_forward`, and their `cnn_loss_reg` on the region states
    (6, 4, 81)."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(TASK_CFG)
    raw, _ = read_released(REFERENCES / "vcr.model")
    io = load_file(REFERENCES / "vcr_io.safetensors")
    config = dataclasses.replace(vl.config_from_authors(cfg), visual_feat_dim=64, geometry_dim=64)
    config, state, model_name = vl.read_with_config(raw, config, drop_heads=False, notes=[])
    assert model_name == "VlBertForMultipleChoice" and config.num_region_classes == 81
    model = VlBertForMultipleChoice(config).eval()
    model.load_state_dict(state, strict=True)
    boxes = io["input.boxes"][..., :4]
    wh = io["input.im_info"][:, None, :2].repeat(1, 1, 2)
    region_mask = boxes[..., 3] > -0.5
    with torch.no_grad():
        out = model(input_ids=io["input.text_ids"], attention_mask=io["input.text_mask"],
                    token_type_ids=io["input.token_type_ids"], text_regions=io["input.text_tags"],
                    features=io["input.features"], boxes=boxes / wh, region_mask=region_mask)
    real = region_mask.repeat_interleave(3, dim=0)
    pairs = {"choice scores": (out.choice_scores, io["output.logits"]),
             "region class logits": (out.region_class_logits[real],
                                     io["output.region_class_logits"][real])}
    for name, (ours, theirs) in pairs.items():
        abs_err, rel_err = errors(ours, theirs)
        print(f"vcr {name}: max abs {abs_err:.2e}, max rel {rel_err:.2e}")
        assert abs_err <= TOLERANCE, name
    written = vl.write_official(config, state, model_name)
    assert written.keys() == raw.keys()
    assert all(torch.equal(written[n], raw[n]) for n in raw)


@pytest.mark.parametrize(("line", "replacement", "error"), [
    ("visual_ln: true", "visual_ln: false", "visual_ln false"),
    ("visual_size: 16", "visual_size: 8", "visual_1x1"),
    ('hidden_act: "gelu"', 'hidden_act: "relu"', "hidden_act"),
    (TASK_CFG, "NETWORK: {}\n", "not a VL-BERT cfg"),
])
def test_their_cfgs_without_a_counterpart_are_refused(line, replacement, error, tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(TASK_CFG.replace(line, replacement))
    with pytest.raises(CheckpointError, match=error):
        vl.config_from_authors(cfg)
