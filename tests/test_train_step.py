"""The training step's fast paths (issue 40), against the paths they replaced, for the four
architectures on the same rows as the sync tests (texts and region counts vary, an image has no
region at all):

- one product for the projections that share an input (model/attention.py `project`) and key
  masks prepared once per forward as SDPA's -inf bias: the losses and every gradient equal those
  of separate projections and a boolean mask given to SDPA at every call;
- bfloat16 weights with float32 master weights (run.precision=bf16): the compute copy is the
  master cast, gradients reach the master in float32 and weights come back after the step; a
  step's casts do not grow with the model's depth (under autocast they do); over 200 steps of
  the tiny LXMERT the losses follow float32's within 1% where a learning rate 40% higher leaves
  them by more than 5%;
- kernel-launching ops per layer, counted, pinned;
- the state a CUDA graph's warm-up changes (TrainStep.snapshot / restore) is put back exactly
  (the captured step itself: tests/test_graphs_gpu.py, on a GPU).
"""

import sys
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from step_rows import (
    ARCH_NAMES,
    MAX_BOXES,
    model_config,
    objective,
    pretrain_rows,
    pretraining_model,
)
from test_pretrain_loop import tiny_config, train_losses

from model.archs import ARCHS
from pipeline.bench.dispatch import count_dispatch
from pipeline.common.config import ConfigError
from pipeline.common.text import load_tokenizer
from pipeline.pretrain.job import pretrain_job
from pipeline.train.config import OptimConfig, RunConfig, VisualConfig, cuda_graph
from pipeline.train.launch import run_training
from pipeline.train.precision import Precision, resolve_precision
from pipeline.train.step import TrainStep, param_groups, warmup_linear

B = 8


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def separate(x, *linears):
    """What `project` replaced: one product per Linear."""
    return tuple(linear(x) for linear in linears)


def boolean_attend(q, k, v, keep, *, num_heads, dropout_p=0.0, need_weights=False):
    """The attention `attend` replaced: the boolean mask handed to SDPA at every call, its
    keyless queries found at every call."""
    assert not need_weights

    def heads(x):
        return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)

    q, k, v = heads(q), heads(k), heads(v)
    some = None
    if keep is not None:
        keep = keep[:, None, None, :] if keep.dim() == 2 else keep
        some = keep.any(-1, keepdim=True)
        keep = keep | ~some
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p)
    if some is not None:
        out = out * some
    return out.transpose(1, 2).flatten(2), None


def losses_and_grads(model, build, batch):
    model.zero_grad(set_to_none=True)
    losses, _ = build.compute(model, batch)
    sum(losses.values()).backward()
    return ({k: v.detach() for k, v in losses.items()},
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_joined_projections_and_prepared_masks_equal_the_paths_they_replaced(
    arch, tokenizer, monkeypatch
):
    pairs, samples, passages = pretrain_rows(B, seed=3)
    build = objective(arch, tokenizer, static_shapes=False)
    batch = build.make_batch(pairs, samples, np.random.default_rng(0), epoch=0, texts=passages)
    assert batch.inputs["region_mask"] is not None and not batch.inputs["region_mask"][0].any()
    model = pretraining_model(arch, tokenizer).train()
    fast_losses, fast_grads = losses_and_grads(model, build, batch)
    module = sys.modules[f"model.{arch}"]
    monkeypatch.setattr(module, "project", separate)
    monkeypatch.setattr(module, "key_mask", lambda keep, dtype=None: keep)
    monkeypatch.setattr(module, "attend", boolean_attend)
    losses, grads = losses_and_grads(model, build, batch)
    assert fast_losses.keys() == losses.keys() and fast_grads.keys() == grads.keys()
    for name, value in losses.items():
        torch.testing.assert_close(fast_losses[name], value, rtol=1e-5, atol=1e-6, msg=name)
    for name, grad in grads.items():
        scale = float(grad.abs().max()) or 1.0
        torch.testing.assert_close(fast_grads[name], grad, rtol=0, atol=1e-5 * scale + 1e-7,
                                   msg=name)


def train_config(precision: str, **optim):
    return SimpleNamespace(optim=OptimConfig(**optim), run=RunConfig(precision=precision),
                           visual=VisualConfig())


def lxmert_step(tokenizer, precision: str, layers: int = 2, dropout: float = 0.0):
    """A TrainStep of a tiny LXMERT with `layers` language layers, and a batch for it."""
    torch.manual_seed(0)
    config = replace(model_config("lxmert", tokenizer, dropout), language_layers=layers)
    model = ARCHS["lxmert"].pretraining(config).train()
    build = objective("lxmert", tokenizer, static_shapes=True)
    pairs, samples, _ = pretrain_rows(B, seed=4)
    batch = build.make_batch(pairs, samples, np.random.default_rng(1), epoch=0)
    step = TrainStep(model, build, train_config(precision), torch.device("cpu"), total_steps=10)
    return step, batch


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_the_step_equals_the_textbook_step(arch, tokenizer):
    """TrainStep in float32 (learning rates in tensors, stats packed, dropout on) against what it
    replaced: backward of the summed losses, clip_grad_norm_, fused AdamW with float rates under
    LambdaLR's warm-up schedule. Three steps, bit for bit, at rates float32 holds exactly (2^-13
    times 0.5, 1, 1): AdamW takes a rate in a tensor as float32, a float one as a double."""
    pairs, samples, passages = pretrain_rows(B, seed=5)
    build = objective(arch, tokenizer, static_shapes=True)
    batches = [build.make_batch(pairs, samples, np.random.default_rng(i), epoch=0,
                                texts=passages) for i in range(3)]
    ours = pretraining_model(arch, tokenizer, dropout=0.1).train()
    theirs = pretraining_model(arch, tokenizer, dropout=0.1).train()
    config = train_config("float32", warmup_steps=2, lr=2.0**-13)
    step = TrainStep(ours, build, config, torch.device("cpu"), total_steps=5)
    groups = [{**g, "params": list(g["params"])} for g in
              param_groups(theirs, config.optim.weight_decay, config.optim.lr, 1.0)]
    optimizer = torch.optim.AdamW(groups, lr=config.optim.lr, betas=config.optim.betas,
                                  eps=config.optim.eps, fused=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear(5, 2))
    for at, batch in enumerate(batches):
        step.set_lr(at)
        stats = step.micro(batch, seed=at)
        step.update()
        torch.manual_seed(at)
        losses, _ = build.compute(theirs, batch)
        sum(losses.values()).backward()
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), config.optim.grad_clip)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        assert torch.equal(stats[:len(losses)], torch.stack(list(losses.values())).detach())
        for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
            assert torch.equal(a, b), f"{arch} step {at}: {name}"


def test_bf16_computes_on_a_cast_copy_and_steps_the_float32_master(tokenizer):
    step, batch = lxmert_step(tokenizer, "bf16")
    master, compute = step.module, step.compute
    assert compute is not master and step.model is compute
    pairs = list(zip(master.parameters(), compute.parameters(), strict=True))
    assert all(m.dtype == torch.float32 and c.dtype == torch.bfloat16 for m, c in pairs)
    assert all(torch.equal(c, m.to(torch.bfloat16)) for m, c in pairs)
    tied = compute.mlm_head.decoder.weight is compute.lxmert.embeddings.word_embeddings.weight
    assert tied and len(pairs) == len(list(compute.parameters()))
    before = [m.detach().clone() for m, _ in pairs]
    step.set_lr(0)
    step.micro(batch, seed=0)
    assert all(m.grad is None for m, _ in pairs)  # the backward reaches the compute copy only
    step.precision.grads_to_master()
    reached = [(m, c) for m, c in pairs if c.grad is not None]
    assert reached and all(torch.equal(m.grad, c.grad.float()) for m, c in reached)
    assert all(m.grad is None for m, c in pairs if c.grad is None)
    step.update()
    assert all(m.grad is None and c.grad is None for m, c in pairs)
    assert all(torch.equal(c, m.to(torch.bfloat16)) for m, c in pairs)  # weights came back
    assert any(not torch.equal(m, b) for (m, _), b in zip(pairs, before))  # and the step moved


def step_casts(tokenizer, precision: str, layers: int) -> int:
    step, batch = lxmert_step(tokenizer, precision, layers)
    step.set_lr(0)

    def run():
        step.micro(batch, seed=0)
        step.update()

    run()  # the master's gradient buffers are made at the first step
    return count_dispatch(run)[1].casts


def test_bf16_casts_per_step_do_not_grow_with_depth_where_autocasts_do(tokenizer):
    bf16 = [step_casts(tokenizer, "bf16", layers) for layers in (1, 3)]
    autocast = [step_casts(tokenizer, "autocast", layers) for layers in (1, 3)]
    # Two multi-tensor copies (gradients, weights), the region features and boxes into the
    # model, six heads' scores into their float32 losses (masked LM, matching, object,
    # attribute, feature, QA) and their gradients back.
    assert bf16 == [16, 16], bf16
    assert autocast[1] - autocast[0] >= 2 * 20, autocast  # ~22 casts a language layer more
    assert autocast[0] > 4 * bf16[0], (autocast, bf16)


def step_ops(tokenizer, layers: int) -> int:
    step, batch = lxmert_step(tokenizer, "float32", layers)
    step.set_lr(0)

    def run():
        step.micro(batch, seed=0)
        step.update()

    run()  # AdamW makes its state at the first step
    return count_dispatch(run)[1].ops


def test_a_language_layer_costs_its_pinned_ops(tokenizer):
    """Forward and backward of one LxmertLayer over the text, dropout off (so that SDPA runs its
    one fused kernel on the CPU, as on a GPU): 33. It was 46 before issue 40: a product and its
    backward (addmm; mm, mm, sum) for each of the three projections where one serves (plus two
    joins of the weights and one of the gradients), two adds of the input's three gradients, the
    mask's any, not and or, and SDPA's conversion of a boolean mask (two scalars, a where)."""
    assert step_ops(tokenizer, 3) - step_ops(tokenizer, 2) == 33


def test_snapshot_and_restore_put_back_the_weights_and_the_optimizer_state(tokenizer):
    step, batch = lxmert_step(tokenizer, "bf16", dropout=0.1)

    def one(at: int):
        step.set_lr(at)
        stats = step.micro(batch, seed=at)
        step.update()
        return stats

    one(0)  # some optimizer state exists before the snapshot, some is made after it
    state = {p: {k: v.clone() for k, v in s.items()} for p, s in step.optimizer.state.items()}
    weights = [p.detach().clone() for p in step.module.parameters()]
    snapshot = step.snapshot()
    expected = one(1)
    for at in (1, 2):
        one(at)
    step.restore(snapshot)
    assert all(torch.equal(p, w) for p, w in zip(step.module.parameters(), weights))
    compute = zip(step.module.parameters(), step.compute.parameters())
    assert all(torch.equal(c, m.to(torch.bfloat16)) for m, c in compute)
    for param, now in step.optimizer.state.items():
        for key, value in now.items():
            want = state[param][key] if param in state else torch.zeros_like(value)
            assert torch.equal(value, want), key
    assert torch.equal(one(1), expected)  # the step after a restore is the step after the snapshot


def test_bf16_losses_follow_float32_over_200_steps(pretrain_world, tmp_path):
    """The tiny LXMERT (no dropout), 200 steps of 4 logged every 10: run.precision=bf16 within 1%
    of float32 at every log (0.12% when written); a learning rate 40% higher, the control, is
    more than 5% away by the end (16%): the tolerance tells runs apart."""
    sets = ["run.max_steps=200", "run.epochs=1000", "run.val_every=200", "run.log_every=10",
            "data.batch_size=4", "run.threads_per_worker=2"]  # both cores: 54 s -> 44 s
    totals = {}
    for name, extra in (("float32", []), ("bf16", ["run.precision=bf16"]),
                        ("control", ["optim.lr=7e-4"])):
        run_training(pretrain_job, tiny_config(pretrain_world, "lxmert", *sets, *extra),
                     tmp_path / name)
        totals[name] = {step: sum(v for k, v in values.items() if k.startswith("loss_"))
                        for step, values in train_losses(tmp_path / name).items()}
    assert sorted(totals["bf16"]) == sorted(totals["float32"]) == list(range(10, 201, 10))
    for step, want in totals["float32"].items():
        assert totals["bf16"][step] == pytest.approx(want, rel=0.01), step
    assert abs(totals["control"][200] / totals["float32"][200] - 1) > 0.05


def test_precision_and_cuda_graph_are_checked():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert resolve_precision("auto", cpu, trainable_detector=False) == "float32"
    assert resolve_precision("auto", gpu, trainable_detector=False) == "bf16"
    assert resolve_precision("auto", gpu, trainable_detector=True) == "autocast"
    with pytest.raises(ConfigError, match="visual.trainable|end to end"):
        resolve_precision("bf16", gpu, trainable_detector=True)
    config = SimpleNamespace(optim=OptimConfig(accumulation=2),
                             run=RunConfig(cuda_graph=True, shapes="dynamic"),
                             visual=VisualConfig())
    with pytest.raises(ConfigError) as caught:
        cuda_graph(config, cpu, world=2)
    for need in ("a CUDA device", "one worker", "optim.accumulation 1", "static shapes"):
        assert need in str(caught.value)
    assert not cuda_graph(replace_run(config, cuda_graph=False), cpu, world=2)


def replace_run(config, **changes):
    return SimpleNamespace(optim=config.optim, run=replace(config.run, **changes),
                           visual=config.visual)


def test_precision_float32_and_autocast_compute_on_the_module_itself(tokenizer):
    model = torch.nn.Linear(3, 3)
    for name in ("float32", "autocast"):
        precision = Precision(name, model, torch.device("cpu"))
        assert precision.compute is model
        precision.grads_to_master()
        precision.weights_to_compute()  # nothing to do, nothing done
    with Precision("autocast", model, torch.device("cpu")).context():
        assert model(torch.ones(1, 3)).dtype == torch.bfloat16


def test_a_config_that_cannot_be_captured_is_refused_before_the_run(pretrain_world):
    """The pretraining and fine-tuning configs check run.cuda_graph with what they know (the
    device only where run.device names it), so that no worker starts on a config that fails."""
    with pytest.raises(ConfigError,
                       match="run.cuda_graph needs a CUDA device, optim.accumulation 1"):
        tiny_config(pretrain_world, "lxmert", "run.cuda_graph=true", "run.device=cpu",
                    "optim.accumulation=2")
    config = tiny_config(pretrain_world, "lxmert", "run.cuda_graph=true")  # auto: a GPU may come
    assert config.run.cuda_graph


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_static_batches_share_one_graph_signature(arch, tokenizer):
    """A captured graph serves the batches of its signature (keys, shapes, dtypes, which values
    are None: a static batch whose regions are all real has no region mask). Every static batch
    of an objective has the same one whatever its rows (LXMERT's QA answers too: 10 a row, not
    the batch's most); a padded batch another, but where every batch has a mask. Its tensors are
    read in one order."""
    from pipeline.train.batch import TrainBatch
    from pipeline.train.graphs import batch_tensors, signature

    build = objective(arch, tokenizer, static_shapes=True)
    batches = []
    for seed in range(4):
        pairs, samples, passages = pretrain_rows(B, seed=seed, boxes=(MAX_BOXES, MAX_BOXES + 1))
        batches.append(build.make_batch(pairs, samples, np.random.default_rng(seed), epoch=0,
                                        texts=passages))
    # every region real: no mask (VL-BERT's text-only rows have no region)
    assert (batches[0].inputs["region_mask"] is None) == (arch != "vlbert")
    assert len({signature(b) for b in batches}) == 1
    pairs, samples, passages = pretrain_rows(B, seed=6)  # an image without regions
    padded = build.make_batch(pairs, samples, np.random.default_rng(0), epoch=0, texts=passages)
    assert (signature(padded) == signature(batches[0])) == (arch == "vlbert")  # a mask always
    tensors = batch_tensors(batches[0])
    assert len(tensors) == sum(v is not None for p in (batches[0].inputs, batches[0].targets)
                               for v in p.values())
    assert tensors[0] is batches[0].inputs["input_ids"]
    with pytest.raises(ValueError, match=r"captures tensors only; batch inputs\['image_sizes'\]"):
        signature(TrainBatch(inputs={**padded.inputs, "image_sizes": ((1, 2),)},
                             targets=padded.targets, size=padded.size))
