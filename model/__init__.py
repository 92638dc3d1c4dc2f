"""Cross-modal transformers over region features: LXMERT, VisualBERT, VL-BERT and ViLBERT.

The public API is `__all__`: `load(path)` (any checkpoint format, a model ready to run) and
`save(model, dir)` (our format), the four configs and encoders, `ARCHS` (the table of the four)
and `CheckpointError`; model.checkpoints is the formats' own API (`load_checkpoint`, `save_hf`,
...). Everything else may change.

This package depends on torch only: it never imports `pipeline`, `extractor`, `shards` or Ray, so
a model runs in a notebook or on a GPU box without the rest of the project.

The contract every architecture follows (model/lxmert.py, visualbert.py, vlbert.py, vilbert.py):
- a frozen config dataclass documenting each field, with `paper()` and `tiny()` constructors;
- `forward(*, input_ids (B, T) long, attention_mask (B, T) {0, 1}, token_type_ids (B, T) or None,
  features (B, N, D) float, boxes (B, N, 4) x1 y1 x2 y2 normalised to [0, 1] by the image size,
  region_mask (B, N) {0, 1} with 1 for a real region, ...)` (keyword-only), returning a dataclass
  with `text_hidden (B, T, H)`, `visual_hidden (B, N, Hv)` and `pooled (B, H)` (ViLBERT: its
  visual stream prepends a global image region, so `visual_hidden` is (B, N + 1, Hv), and both of
  its pooled outputs, `pooled` and `pooled_visual`, are projected to the co-attention width);
- one attention for all four: `attend` in model/attention.py (SDPA; the same maths written out
  when the attention maps are asked for) under boolean keep masks of text and regions: padded
  tokens and padded regions never change the outputs at real positions, and a query with nothing
  to attend to gets a uniform row, not NaN;
- state_dict key names are our public API; other checkpoint formats (official LXMERT, Hugging
  Face, BERT for the text stream) are mapped by explicit tables in model/checkpoints/.
model/archs.py is the one table of the four by name (config, encoder, pretraining model, what a
checkpoint holds). Heads shared by the architectures live in model/heads.py; pretraining models: LxmertForPreTraining
in lxmert.py, the others in `<arch>_pretraining.py`; task models (QA, NLVR2 pair, multiple
choice, region score, retrieval) for any encoder in tasks.py.
"""

from model.api import load, save
from model.archs import ARCH_NAMES, ARCHS, Arch
from model.errors import CheckpointError
from model.lxmert import LxmertConfig, LxmertForPreTraining, LxmertModel
from model.vilbert import VilBertConfig, VilBertModel
from model.visualbert import VisualBertConfig, VisualBertModel
from model.vlbert import VlBertConfig, VlBertModel

__all__ = [
    "ARCHS",
    "ARCH_NAMES",
    "Arch",
    "CheckpointError",
    "LxmertConfig",
    "LxmertForPreTraining",
    "LxmertModel",
    "VilBertConfig",
    "VilBertModel",
    "VisualBertConfig",
    "VisualBertModel",
    "VlBertConfig",
    "VlBertModel",
    "load",
    "save",
]
