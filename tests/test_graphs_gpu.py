"""The whole training step captured as one CUDA graph (pipeline/train/graphs.py), on a GPU only
(opt-in: `pytest -m gpu`). Imports what a GPU machine's own Python has (torch, transformers):
the rows, batch and tokenizer of `pipeline bench step`."""

import argparse
import dataclasses
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from model.archs import ARCHS
from pipeline.bench import step as bench
from pipeline.bench.dispatch import count_dispatch
from pipeline.bench.loop_data import tokenizer_dir
from pipeline.common.text import load_tokenizer
from pipeline.train.config import OptimConfig, RunConfig, VisualConfig


def settings() -> bench.StepSettings:
    parser = argparse.ArgumentParser()
    bench.add_args(parser)
    args = parser.parse_args(["--arch", "lxmert", "--size", "tiny", "--batch-size", "8",
                              "--variants", "bf16", "--device", "cuda"])
    return bench.resolve(args, cuda_available=True)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", bench.ARCHES)
def test_the_captured_step_replays_the_eager_steps(arch):
    """Two copies of the tiny model (dropout 0.1, bf16 master weights), one stepped eagerly, one
    by replays of its captured step: the same stats and weights after 5 steps; a replayed step
    dispatches two host ops (the batch's copy into the captured one, the clone of its stats)
    against the eager step's hundreds."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from pipeline.train.graphs import GraphedStep
    from pipeline.train.step import TrainStep

    device = torch.device("cuda")
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = load_tokenizer(tokenizer_dir(Path(tmp)))
    config = dataclasses.replace(bench.model_config(arch, "tiny", tokenizer.vocab_size),
                                 hidden_dropout=0.1, attention_dropout=0.1)
    objective, batch = bench.build_batch(arch, config, tokenizer, settings())
    batch = batch.to(device)
    runs = {}
    for name in ("eager", "graph"):
        torch.manual_seed(0)
        module = ARCHS[arch].pretraining(config).to(device).train()
        train_config = SimpleNamespace(optim=OptimConfig(), run=RunConfig(precision="bf16"),
                                       visual=VisualConfig())
        step = TrainStep(module, objective, train_config, device, total_steps=10,
                         capturable=name == "graph")
        graphed = GraphedStep(step) if name == "graph" else None

        def one(at: int) -> torch.Tensor:
            step.set_lr(at)
            if graphed is not None:
                return graphed(batch, seed=at)
            stats = step.micro(batch, seed=at)
            step.update()
            return stats

        stats, ops = [], []
        for at in range(5):
            out, counts = count_dispatch(lambda: one(at))
            stats.append(out)
            ops.append(counts.ops - len(step.base_lrs))  # set_lr fills each group's rate
        runs[name] = (torch.stack(stats).cpu(), [p.detach().cpu() for p in module.parameters()],
                      ops)
    (eager_stats, eager_weights, eager_ops), (graph_stats, graph_weights, graph_ops) = (
        runs["eager"], runs["graph"])
    torch.testing.assert_close(graph_stats, eager_stats, rtol=1e-3, atol=1e-4)
    for got, want in zip(graph_weights, eager_weights):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)
    assert graph_ops[1:] == [2] * 4 and min(eager_ops) > 200, (graph_ops, eager_ops)
