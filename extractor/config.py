"""Configuration of the bottom-up-attention detector, its preprocessing and box selection.

The defaults are the real Visual Genome Faster R-CNN (ResNet-101 C4) of REFERENCE §1. Tests shrink
it with `depth=18, width=16`. Named presets bundle the preprocessing and selection conventions of
the feature files users compare against; the chosen preset is recorded in every shard.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Literal

BoxMode = Literal["adaptive", "fixed", "given"]
SavedBoxes = Literal["proposals", "regressed"]
RankUnit = Literal["region", "detection"]
ProposalFilter = Literal["caffe", "detectron2"]
AttrSoftmax = Literal["with_none", "without_none"]
ResizeMethod = Literal["cv2", "pil", "torch", "maskrcnn"]
StemPool = Literal["caffe", "torchvision"]
STEM_POOLS = ("caffe", "torchvision")
RegionPooler = Literal["roi_pool", "roi_align"]
REGION_POOLERS = ("roi_pool", "roi_align")
BoxConvention = Literal["detectron2", "detectron"]
BOX_CONVENTIONS = ("detectron2", "detectron")
RegionLabel = Literal["argmax", "kept"]

# ResNet depth -> residual blocks in res2, res3, res4, res5.
BLOCKS_PER_STAGE: dict[int, tuple[int, int, int, int]] = {
    18: (2, 2, 2, 2),
    34: (3, 4, 6, 3),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
}


@dataclass(frozen=True)
class DetectorConfig:
    """Architecture of the Faster R-CNN C4 detector.

    depth: ResNet depth (18, 34: basic blocks; 50, 101, 152: bottleneck blocks).
    width: channels of the stem; bottleneck res2 has `width` inner and `4 * width` output channels,
        so the region feature has `32 * width` dims (2048 for the real model).
    num_classes / num_attributes: object classes and attributes (Visual Genome's 1600 and 400);
        the class head adds a background score, the attribute head a "no attribute" score.
    rpn_hidden: channels of the RPN's 3x3 conv, before its objectness and box-delta 1x1 convs.
    anchor_sizes / aspect_ratios: the anchors at every res4 cell: each size (the square root of
        its area, in input pixels) at each height / width ratio.
    feature_stride: input pixels per res4 cell (16 for the C4 backbone): the anchors' spacing,
        and RoI pooling's scale 1 / feature_stride.
    rpn_pre_nms_topk: proposals per image, best objectness first, that enter the RPN's NMS (6000
        in the BUTD models).
    rpn_post_nms_topk: proposals kept after the RPN's NMS (300 in the BUTD models): the RoIs the
        box head scores and selection chooses from.
    rpn_nms_thresh: IoU above which the RPN's NMS drops the lower-scored proposal.
    rpn_min_size: the smallest proposal width and height kept, in original-image pixels,
        dropped before the pre-NMS top-k (Caffe's RPN_MIN_SIZE 16): in training always, in
        extraction with selection.rpn_filter "caffe".
    pooler_resolution: side of the square grid each RoI is max-pooled to from res4 (14 in the
        BUTD models), the input of res5.
    res5_dilation: dilation of res5's 3x3 convs, which run at stride 1 on the pooled RoIs (2 in
        the BUTD models).
    attr_embed_dim: size of the predicted class's embedding that the attribute head concatenates
        to the region feature.
    attr_hidden: width of the attribute head's hidden layer (ReLU), before its attribute scores.
    bbox_reg_weights: divisors (x, y, w, h) of the predicted box deltas, detectron2's
        Box2BoxTransform weights (10, 10, 5, 5: Caffe's BBOX_NORMALIZE_STDS 0.1, 0.1, 0.2, 0.2).
    pixel_mean_bgr: per-channel mean, B G R on the 0-255 scale, subtracted from every pixel
        (Caffe's PIXEL_MEANS).
    stem_pool: the stem's 3x3 stride-2 max-pool. "caffe": padding 0, ceil_mode (the BUTD
        models); "torchvision": padding 1, floor (VL-BERT's ResNet, common/backbone/resnet: the
        CNN its end-to-end files carry; VinVL's maskrcnn_benchmark BaseStem). The two shift the
        pooling grid by one pixel, so every feature after the stem differs.
    groups / width_per_group: ResNeXt's grouped 3x3: res2's bottleneck has groups *
        width_per_group inner channels (doubling per stage), split in `groups` groups; None
        means `width` (a plain ResNet, groups 1). VinVL's X152-C4: 32 x 8 (NUM_GROUPS,
        WIDTH_PER_GROUP); its outputs stay 4 * width * 2^k as a ResNet's (RES2_OUT_CHANNELS 256).
    stride_in_3x3: a bottleneck's stride sits in its 3x3 conv (maskrcnn_benchmark's
        STRIDE_IN_1X1 False, the torchvision / ResNeXt layout) instead of its first 1x1 (Caffe).
    norm_eps: the frozen BatchNorms' epsilon: 1e-5 (detectron2), 0 (maskrcnn_benchmark's
        FrozenBatchNorm2d scales by running_var.rsqrt() alone).
    res5_stride: stride of res5's first block on the pooled RoIs: 1 (BUTD, dilated 3x3) or 2
        (maskrcnn_benchmark's ResNetHead: 14x14 RoIs become 7x7, no dilation).
    pooler: how RoIs are pooled from res4: "roi_pool" (max, the BUTD models) or "roi_align"
        (maskrcnn_benchmark's ROIAlign: not aligned, adaptive sampling ratio 0).
    box_convention: "detectron2": widths x2 - x1, boxes clipped to [0, width]; "detectron":
        Detectron's "+1" (maskrcnn_benchmark's TO_REMOVE): generate_anchors' rounded integer
        anchors, widths x2 - x1 + 1 in box decoding, clipping to [0, width - 1], and an RPN
        proposal kept while its width + 1 >= 0 (remove_small_boxes at MIN_SIZE 0).
    """

    depth: int = 101
    width: int = 64
    num_classes: int = 1600
    num_attributes: int = 400
    rpn_hidden: int = 512
    anchor_sizes: tuple[int, ...] = (64, 128, 256, 512)
    aspect_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)
    feature_stride: int = 16
    rpn_pre_nms_topk: int = 6000
    rpn_post_nms_topk: int = 300
    rpn_nms_thresh: float = 0.7
    rpn_min_size: float = 16.0
    pooler_resolution: int = 14
    res5_dilation: int = 2
    attr_embed_dim: int = 256
    attr_hidden: int = 512
    bbox_reg_weights: tuple[float, float, float, float] = (10.0, 10.0, 5.0, 5.0)
    pixel_mean_bgr: tuple[float, float, float] = (102.9801, 115.9465, 122.7717)
    stem_pool: StemPool = "caffe"
    groups: int = 1
    width_per_group: int | None = None
    stride_in_3x3: bool = False
    norm_eps: float = 1e-5
    res5_stride: int = 1
    pooler: RegionPooler = "roi_pool"
    box_convention: BoxConvention = "detectron2"

    def __post_init__(self):
        if self.depth not in BLOCKS_PER_STAGE:
            depths = ", ".join(str(d) for d in BLOCKS_PER_STAGE)
            raise ValueError(f"depth = {self.depth}: supported depths are {depths}")
        _check_positive(self, "width", "num_classes", "num_attributes", "rpn_hidden",
                        "feature_stride", "rpn_pre_nms_topk", "rpn_post_nms_topk",
                        "pooler_resolution", "res5_dilation")
        if self.stem_pool not in STEM_POOLS:
            raise ValueError(f"stem_pool = {self.stem_pool!r}: choose one of {STEM_POOLS}")
        if self.pooler not in REGION_POOLERS:
            raise ValueError(f"pooler = {self.pooler!r}: choose one of {REGION_POOLERS}")
        if self.box_convention not in BOX_CONVENTIONS:
            raise ValueError(
                f"box_convention = {self.box_convention!r}: choose one of {BOX_CONVENTIONS}")
        _check_positive(self, "groups", "res5_stride")
        if self.width_per_group is not None:
            _check_positive(self, "width_per_group")
        if self.groups > 1 and not self.bottleneck:
            raise ValueError(f"groups = {self.groups}: grouped convs need a bottleneck depth")

    @property
    def inner_width(self) -> int:
        """Inner channels of res2's bottleneck (its 3x3 conv's), doubled at every stage."""
        return self.width if self.width_per_group is None else self.groups * self.width_per_group

    @property
    def bottleneck(self) -> bool:
        return self.depth >= 50

    @property
    def feature_dim(self) -> int:
        return self.width * (32 if self.bottleneck else 8)

    @property
    def res4_channels(self) -> int:
        return self.width * (16 if self.bottleneck else 4)

    @property
    def num_anchors(self) -> int:
        return len(self.anchor_sizes) * len(self.aspect_ratios)


@dataclass(frozen=True)
class PreprocessConfig:
    """Resize of the decoded image before the CNN (BGR, mean-subtracted, std 1).

    min_size / max_size: shortest side scaled to `min_size` unless the longest would exceed
    `max_size`. resize: "cv2" resizes float pixels by one scale factor with cv2's bilinear, and
    the longest side is compared after rounding (Caffe's test code); "pil" resizes the uint8 image
    with PIL bilinear, antialiased when shrinking (detectron2's ResizeShortestEdge); "torch"
    resizes float pixels with torch bilinear (the Hugging Face demo); "maskrcnn" resizes as "pil"
    to maskrcnn_benchmark's Resize.get_size (the long side truncated, not rounded: VinVL).

    max_pixels / min_side: decoding refuses images with more than `max_pixels` pixels (read from
    the header, before any pixel is decoded; the default is the count at which PIL itself raises
    DecompressionBombError) and images whose short side, before or after the resize, is below
    `min_side` pixels (16 = one res4 cell of the stride-16 C4 network: a narrower image yields an
    empty feature map or regions pooled from less than one cell).
    """

    min_size: int = 600
    max_size: int = 1000
    resize: ResizeMethod = "pil"
    max_pixels: int = 178_956_970
    min_side: int = 16

    def __post_init__(self):
        _check_positive(self, "min_size", "max_size", "max_pixels", "min_side")
        if self.min_size > self.max_size:
            raise ValueError(f"min_size = {self.min_size}: must be <= max_size = {self.max_size}")
        if self.min_side > self.min_size:  # every resized short side would be below min_side
            raise ValueError(f"min_side = {self.min_side}: must be <= min_size = {self.min_size}")


@dataclass(frozen=True)
class SelectionConfig:
    """Which regions are kept, and which boxes are saved with their features.

    mode: "adaptive" keeps min_boxes..max_boxes regions scoring >= score_thresh after per-class NMS;
        "fixed" keeps exactly num_boxes, sweeping nms_thresholds until enough survive;
        "given" computes features for caller-supplied boxes (no RPN).
    min_boxes / max_boxes: "adaptive" mode's fewest and most regions per image: those scoring
        >= score_thresh, topped up by confidence to min_boxes, cut at max_boxes (Caffe's 10..100).
    num_boxes: "fixed" mode's regions per image (36: LXMERT's and the demos' files), topped up by
        confidence when fewer reach score_thresh.
    score_thresh: the class confidence a region needs to count as detected (Caffe's 0.2);
        regions below it only top up a count.
    nms_thresh: "adaptive" mode's NMS IoU threshold (Caffe's 0.3).
    nms_thresholds: "fixed" mode's NMS IoU thresholds, tried in order until num_boxes regions
        reach score_thresh (the last one is topped up by confidence).
    class_agnostic: NMS over each proposal's best-class regressed box (Hugging Face demo) instead of
        per-class NMS.
    saved_boxes: "proposals": NMS runs on, and the shard saves, the raw RPN boxes the features were
        pooled from (Caffe script); "regressed": NMS runs on, and the shard saves, the class-specific
        regressed boxes of each region's best class.
    nms_plus_one: Caffe's box convention in NMS (width = x2 - x1 + 1, IoU compared in float32);
        False is torchvision's (width = x2 - x1).
    rank: "region" ranks each RoI once by the best class score it kept through NMS, with
        score >= score_thresh (Caffe `generate_tsv`); "detection" ranks the (RoI, class) pairs that
        survived NMS with score > score_thresh, so one RoI can be kept twice under two classes
        (detectron2's `fast_rcnn_inference_single_image`, used by the py-bottom-up-attention demo).
    rpn_filter: which RPN proposals may enter NMS. "caffe" drops proposals narrower or shorter than
        `detector.rpn_min_size` pixels of the original image (scaled to the input) before the
        pre-NMS top-k (Caffe's proposal_layer, RPN_MIN_SIZE 16); "detectron2" takes the top-k by
        objectness first, then drops only empty proposals, width or height not > 0
        (detectron2's find_top_rpn_proposals with MIN_SIZE 0, as both demos configure it).
    attr_softmax: "with_none" normalises over all 401 attribute scores, then drops "no attribute"
        (the Caffe net's attr_prob, hence LXMERT's TSVs); "without_none" normalises over the 400
        real attributes only (both demos), which makes every confidence 1 / (1 - p(no attribute))
        times larger.
    label: the class a region region-ranked is saved with: "argmax", its best class (Caffe's
        generate_tsv); "kept", the best class it survived NMS in, whose score is its confidence
        (VinVL's filter_results_peter: `dists_all.max(1)`).
    attr_on_label: the attribute head, run after selection, is conditioned on each region's
        saved class (VinVL's AttrRCNN: the attribute head reads the detections' labels); False:
        on every RoI's argmax class, background included (the detectron2 port).
    attr_thresh: a region's best attribute scoring <= this keeps its id with confidence 0
        (VinVL's POSTPROCESS_ATTRIBUTES_THRESHOLD 0.05; 0 keeps every confidence).
    features_dtype: the saved features' dtype: "float16" (half the bytes; 2e-4 relative) or
        "float32" (VinVL's TSVs hold float32).
    """

    mode: BoxMode = "adaptive"
    min_boxes: int = 10
    max_boxes: int = 100
    num_boxes: int = 36
    score_thresh: float = 0.2
    nms_thresh: float = 0.3
    nms_thresholds: tuple[float, ...] = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    class_agnostic: bool = False
    saved_boxes: SavedBoxes = "proposals"
    nms_plus_one: bool = False
    rank: RankUnit = "region"
    rpn_filter: ProposalFilter = "caffe"
    attr_softmax: AttrSoftmax = "with_none"
    label: RegionLabel = "argmax"
    attr_on_label: bool = False
    attr_thresh: float = 0.0
    features_dtype: Literal["float16", "float32"] = "float16"

    def __post_init__(self):
        _check_positive(self, "max_boxes", "num_boxes")
        if self.label == "kept" and (self.rank != "region" or self.class_agnostic
                                     or self.mode != "adaptive"):
            raise ValueError('label "kept" needs mode "adaptive", rank "region" and per-class '
                             'NMS')
        if not 0 <= self.min_boxes <= self.max_boxes:
            raise ValueError(
                f"min_boxes = {self.min_boxes}: must be between 0 and max_boxes = {self.max_boxes}"
            )


@dataclass(frozen=True)
class ExtractorConfig:
    """What decides an extraction's samples: the detector, its preprocessing and box selection.

    preset: the named convention (PRESETS: caffe, lxmert, pb-demo, hf-demo, vinvl) whose
        preprocessing and selection are the defaults (and detector: PRESET_DETECTORS), recorded in
        every shard.
    save_class_probs: also save each region's class distribution over background and the
        objects (`cls_probs`, background first), which ViLBERT's and VL-BERT's masked-region
        objectives learn from.
    """

    detector: DetectorConfig = field(default_factory=DetectorConfig)
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    preset: str = "caffe"
    save_class_probs: bool = False

    def digest(self) -> str:
        """Short stable hash of the whole configuration (recorded in every shard)."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_positive(config, *names: str) -> None:
    """ValueError "name = value: must be positive" for the first of `names` that is not > 0."""
    for name in names:
        value = getattr(config, name)
        if value <= 0:
            raise ValueError(f"{name} = {value}: must be positive")


CAFFE_PREPROCESS = PreprocessConfig(resize="cv2")

PRESETS: dict[str, tuple[PreprocessConfig, SelectionConfig]] = {
    "caffe": (CAFFE_PREPROCESS, SelectionConfig(mode="adaptive", nms_plus_one=True)),
    # The Caffe 36-box files come from generate_tsv with min = max = 36: one NMS pass at 0.3 and
    # the top 36 by score, however many reach 0.2. A longer sweep would diverge from those files.
    "lxmert": (
        CAFFE_PREPROCESS,
        SelectionConfig(mode="fixed", num_boxes=36, nms_thresholds=(0.3,), nms_plus_one=True),
    ),
    "pb-demo": (
        PreprocessConfig(),
        SelectionConfig(
            mode="fixed",
            num_boxes=36,
            nms_thresholds=(0.5, 0.6, 0.7, 0.8, 0.9),
            saved_boxes="regressed",
            rank="detection",
            rpn_filter="detectron2",
            attr_softmax="without_none",
        ),
    ),
    # The demo's do_nms applies no score threshold: any 36 RoIs surviving NMS are enough.
    "hf-demo": (
        PreprocessConfig(min_size=800, max_size=1333, resize="torch"),
        SelectionConfig(
            mode="fixed",
            num_boxes=36,
            score_thresh=0.0,
            nms_thresholds=(0.5, 0.6, 0.7),
            class_agnostic=True,
            saved_boxes="regressed",
            rpn_filter="detectron2",
            attr_softmax="without_none",
        ),
    ),
}


# VinVL (microsoft/scene_graph_benchmark, sgg_configs/vgattr/vinvl_x152c4.yaml and the README's
# extraction command; docs/reference.md gives each value's line): the ResNeXt-152 32x8d C4 of
# vinvl_vg_x152c4.pth with maskrcnn_benchmark's layers, 1594 objects and 524 attributes.
VINVL_DETECTOR = DetectorConfig(
    depth=152, width=64, groups=32, width_per_group=8, stride_in_3x3=True, norm_eps=0.0,
    stem_pool="torchvision", num_classes=1594, num_attributes=524, rpn_hidden=1024,
    anchor_sizes=(32, 64, 128, 256, 512), res5_dilation=1, res5_stride=2, pooler="roi_align",
    box_convention="detectron", pixel_mean_bgr=(103.530, 116.280, 123.675),
)
PRESETS["vinvl"] = (
    PreprocessConfig(resize="maskrcnn"),
    # NMS_FILTER 1: per-class NMS at 0.3 over all 300 proposals (torchvision's nms), each region
    # labelled with its best surviving class; SCORE_THRESH 0.2, MIN 10 / DETECTIONS_PER_IMG 100;
    # IGNORE_BOX_REGRESSION True: the saved box is the proposal.
    SelectionConfig(mode="adaptive", label="kept", attr_on_label=True, attr_thresh=0.05,
                    rpn_filter="detectron2", features_dtype="float32"),
)
# The detector of a preset whose architecture is not DetectorConfig()'s.
PRESET_DETECTORS: dict[str, DetectorConfig] = {"vinvl": VINVL_DETECTOR}


def preset_config(name: str, detector: DetectorConfig | None = None) -> ExtractorConfig:
    """The ExtractorConfig of a named preset (see PRESETS)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    preprocess, selection = PRESETS[name]
    return ExtractorConfig(
        detector=detector or PRESET_DETECTORS.get(name, DetectorConfig()), preprocess=preprocess,
        selection=selection, preset=name,
    )


# The end-to-end front end (extractor/front_end.py): its stages and poolers, what trains.
Pooler = Literal["roi_pool", "roi_align"]
FRONT_END_STAGES = ("stem", "res2", "res3", "res4", "res5")
POOLERS = ("roi_pool", "roi_align")


@dataclass(frozen=True, kw_only=True)
class VisualFrontEndConfig:
    """What trains and how regions are pooled.

    frozen_stages: stages (of FRONT_END_STAGES) whose parameters get no gradient (requires_grad
        False). VL-BERT's default: the stem and res2. Every BatchNorm is frozen whatever this says.
    pooler: "roi_pool", the detector's max RoIPool (so that untrained features are the extracted
        ones), or "roi_align", VL-BERT's RoIAlign (extractor/front_end.py ROI_ALIGN_*).
        Both pool the detector's `pooler_resolution` square (14 for the R101 model, as VL-BERT)
        from res4 at 1 / `feature_stride`.
    checkpoint_res5: keep no activations of res5 for the backward pass and recompute them there
        (torch.utils.checkpoint, non-reentrant): res5 runs on every box at pooler resolution, so
        its activations grow with the boxes per batch (R101: three blocks of 14 x 14 x 2048
        outputs per box). Same features and gradients, one more res5 forward per step.
    """

    frozen_stages: tuple[str, ...] = ("stem", "res2")
    pooler: Pooler = "roi_pool"
    checkpoint_res5: bool = False

    def __post_init__(self):
        unknown = sorted(set(self.frozen_stages) - set(FRONT_END_STAGES))
        if unknown:
            raise ValueError(f"frozen_stages: unknown stage(s) {unknown}; "
                             f"choose from {FRONT_END_STAGES}")
        if self.pooler not in POOLERS:
            raise ValueError(f"pooler = {self.pooler!r}: choose one of {POOLERS}")
