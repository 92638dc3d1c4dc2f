"""Regional compilation: torch.compile on each repeated transformer layer of our four models, in
place, instead of on the whole model.

A layer class is one piece of code run L times with the same shapes, so the compiler traces and
optimises it once (per input shape and mask presence) and every instance reuses the result: far
less compile time than a whole-model graph, and the model's forward, its heads and the objectives
stay eager Python (a change of task or head costs no recompile). The fusions that matter live in
the layers: the attention's mask handling, bias + GELU, residual + LayerNorm.
"""

from __future__ import annotations

from torch import nn

from model.lxmert import LxmertCrossLayer, LxmertLayer
from model.vilbert import VilBertCoAttentionLayer, VilBertLayer
from model.visualbert import VisualBertLayer
from model.vlbert import VlBertLayer

# The repeated layers of the four architectures (none of them holds another).
LAYER_CLASSES: tuple[type[nn.Module], ...] = (
    LxmertLayer, LxmertCrossLayer, VisualBertLayer, VlBertLayer, VilBertLayer,
    VilBertCoAttentionLayer,
)


def compile_layers(module: nn.Module) -> int:
    """`nn.Module.compile()` on every LAYER_CLASSES instance inside `module` (a model of any of
    the four architectures, with heads or not, or a fine-tuning TaskModel); returns how many.

    In place: the state_dict, the parameters and their names do not change, so optimizers,
    checkpoints and DDP see the same model. Compilation happens at each layer's first call."""
    layers = [m for m in module.modules() if isinstance(m, LAYER_CLASSES)]
    for layer in layers:
        layer.compile()
    return len(layers)
