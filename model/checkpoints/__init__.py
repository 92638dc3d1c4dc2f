"""Checkpoint formats of the field, mapped onto our state_dict names by explicit tables.

- formats.py: detect a checkpoint's format and architecture, read it (`load_checkpoint`), write
  it (`save_ours`, `save_hf`, `save_official`); the formats are described there.
- lxmert.py: LXMERT's Hugging Face and official (`*_LXRT.pth`) names and configs, both ways.
- visualbert.py: VisualBERT's Hugging Face names, heads and config, both ways.
- visualbert_original.py, vilbert.py, vlbert.py: the files those authors released (uclanlp's
  `.th`; both ViLBERT repositories' `.bin`; VL-BERT's `.model`), both ways, with their configs.
- bert.py: `init_text_from_bert`, a BERT checkpoint into any architecture's text stream.
- common.py: the strict comparison, tied tensors, tensor files (`CheckpointError` is in model/errors.py).
Every reader is strict: a CheckpointError lists each missing, unexpected and mis-shaped tensor.
"""

from model.checkpoints.bert import BertInitReport, init_text_from_bert
from model.checkpoints.formats import (
    Checkpoint,
    LoadReport,
    build_model,
    detect,
    load_checkpoint,
    save_hf,
    save_official,
    save_ours,
)
from model.errors import CheckpointError

__all__ = [
    "BertInitReport",
    "Checkpoint",
    "CheckpointError",
    "LoadReport",
    "build_model",
    "detect",
    "init_text_from_bert",
    "load_checkpoint",
    "save_hf",
    "save_official",
    "save_ours",
]
