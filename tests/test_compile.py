"""Regional compilation (model/compile.py): which layers compile_layers compiles in each
architecture, in place; and a tiny LXMERT whose layers are compiled gives eager's losses, compiles
each layer graph once and recompiles nothing on a second step of the same static shapes (slow:
about 40 s of compilation on two cores)."""

import numpy as np
import pytest
import torch
from step_rows import ARCH_NAMES, objective, pretrain_rows, pretraining_model, task_model

from model.compile import LAYER_CLASSES, compile_layers
from pipeline.common.text import load_tokenizer

# The tiny configs' layers: LXMERT 2 language + 1 object + 1 cross-modality; VisualBERT and
# VL-BERT 2; ViLBERT 2 text + 1 visual + 1 co-attention.
LAYERS = {"lxmert": 4, "visualbert": 2, "vlbert": 2, "vilbert": 4}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_every_repeated_layer_is_compiled_in_place(arch, tokenizer):
    for model in (pretraining_model(arch, tokenizer), task_model(arch, "answer", tokenizer)):
        names = list(model.state_dict())
        assert compile_layers(model) == LAYERS[arch]
        compiled = [m for m in model.modules() if m._compiled_call_impl is not None]
        assert len(compiled) == LAYERS[arch] and all(isinstance(m, LAYER_CLASSES) for m in compiled)
        assert list(model.state_dict()) == names  # the same parameters under the same names


@pytest.mark.slow
def test_compiled_lxmert_layers_give_eager_losses_and_compile_once(tokenizer):
    from torch._dynamo.utils import counters

    build = objective("lxmert", tokenizer, True)
    batches = []
    for seed in (1, 2):
        pairs, samples, _ = pretrain_rows(8, seed=seed)
        batches.append(build.make_batch(pairs, samples, np.random.default_rng(seed), epoch=0))
    eager, compiled = pretraining_model("lxmert", tokenizer), pretraining_model("lxmert", tokenizer)
    torch._dynamo.reset()
    counters.clear()
    assert compile_layers(compiled) == LAYERS["lxmert"]
    for step, batch in enumerate(batches):
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            losses, _ = build.compute(compiled, batch)
            sum(losses.values()).backward()
        want, _ = build.compute(eager, batch)
        assert losses.keys() == want.keys()
        for name, value in want.items():
            torch.testing.assert_close(losses[name], value, atol=1e-5, rtol=1e-5, msg=name)
        # one graph per layer code and input shape: LxmertLayer over the T tokens (both language
        # layers), over the N regions, and LxmertCrossLayer; none added by the second step
        assert counters["stats"]["unique_graphs"] == 3, dict(counters["stats"])
