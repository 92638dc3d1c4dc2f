"""`pipeline corpus build` on a generated world: every count checked against counts made here
from the raw annotation files, minival held out of everything, keys, CC3M, determinism, the CLI,
and errors that name the bad file."""

import errno
import io
import json
import os
import re
import shutil
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from pipeline.common.config import resolve
from pipeline.corpus.answers import normalize_answer
from pipeline.corpus.build import build_corpus
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.read import load_split, load_stats, load_text, split_names
from pipeline.corpus.config import CorpusError
from pipeline.datasets.cc3m import list_cc3m
from pipeline.world.generate import WorldConfig, generate_world

WORLD_CONFIG = Path(__file__).parent.parent / "configs" / "corpus" / "world.yaml"
LXMERT_CONFIG = WORLD_CONFIG.with_name("lxmert.yaml")
MINIVAL = 2
QA = ("vqa", "gqa", "vgqa")


def _load(path):
    return json.loads(Path(path).read_text())


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus_world") / "world"
    generate_world(WorldConfig(images=40, seed=3), root, progress=False)
    return root


def _config(root, *sets):
    config = resolve(CorpusConfig(), WORLD_CONFIG, [f"minival_images={MINIVAL}", *sets])
    return resolve(config, sets=[f"root={root}"])


@pytest.fixture(scope="module")
def corpus(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "corpus"
    build_corpus(_config(world), out, progress=False, echo=lambda _: None)
    return out


def _copy_annotations(world, dst):
    """The world without its images: enough for the corpus, fast to copy."""
    shutil.copytree(world, dst, ignore=shutil.ignore_patterns("*.jpg", "*.png", "nlvr2"))
    return dst


def expected_from_raw(world, minival=MINIVAL):
    """split -> key -> source -> [(sentence, answers)], straight from the files."""
    subsets = {}
    for subset in ("train", "val"):
        for image in _load(world / f"coco/annotations/captions_{subset}2014.json")["images"]:
            subsets[image["id"]] = subset
    held_out = set(sorted(i for i, s in subsets.items() if s == "val")[:minival])

    def coco(coco_id):
        if subsets[coco_id] == "train":
            return "train", f"coco-{coco_id}"
        return ("minival" if coco_id in held_out else "nominival"), f"coco-{coco_id}"

    vg_coco = {e["image_id"]: e["coco_id"] for e in _load(world / "vg/image_data.json")}

    def vg(vg_id):
        return coco(vg_coco[vg_id]) if vg_coco[vg_id] else ("vgnococo", f"vg-{vg_id}")

    texts = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for subset in ("train", "val"):
        for ann in _load(world / f"coco/annotations/captions_{subset}2014.json")["annotations"]:
            split, key = coco(ann["image_id"])
            texts[split][key]["mscoco"].append((ann["caption"], None))
        questions = _load(world / f"vqa/v2_OpenEnded_mscoco_{subset}2014_questions.json")
        answers = {a["question_id"]: a["answers"] for a in
                   _load(world / f"vqa/v2_mscoco_{subset}2014_annotations.json")["annotations"]}
        for q in questions["questions"]:
            counts = Counter(normalize_answer(a["answer"]) for a in answers[q["question_id"]])
            scores = {a: min(1.0, round(0.3 * n, 1)) for a, n in counts.items()}
            split, key = coco(q["image_id"])
            texts[split][key]["vqa"].append((q["question"], scores))
        for q in _load(world / f"gqa/{subset}_balanced_questions.json").values():
            split, key = vg(int(q["imageId"]))
            texts[split][key]["gqa"].append((q["question"], {normalize_answer(q["answer"]): 1.0}))
    for entry in _load(world / "vg/region_descriptions.json"):
        split, key = vg(entry["id"])
        texts[split][key]["vg"] += [(r["phrase"], None) for r in entry["regions"]]
    for entry in _load(world / "vg/question_answers.json"):
        split, key = vg(entry["id"])
        texts[split][key]["vgqa"] += [(qa["question"], {normalize_answer(qa["answer"]): 1.0})
                                      for qa in entry["qas"]]
    for parquet in sorted((world / "cc3m").glob("*.parquet")):
        rows = pq.ParquetFile(parquet).read().to_pylist()
        for row in rows:
            if row["status"] == "success":
                texts["cc3m"][f"cc3m-{row['key']}"]["cc3m"].append((row["caption"], None))
    return texts, held_out


def test_counts_match_the_raw_files(world, corpus):
    expected, _ = expected_from_raw(world)
    stats = load_stats(corpus)
    table = {e["ans"] for e in _load(corpus / "answers.json")}
    assert list(stats["splits"]) == ["train", "nominival", "minival", "vgnococo", "cc3m"]
    assert split_names(corpus) == list(stats["splits"])
    assert stats["splits"]["minival"]["images"] == MINIVAL
    assert stats["splits"]["vgnococo"]["images"] > 0 and stats["splits"]["cc3m"]["images"] > 0
    for split, split_stats in stats["splits"].items():
        records = list(load_split(corpus, split))
        keys = [r["image"] for r in records]
        assert keys == sorted(expected[split]), split
        assert split_stats["images"] == len(keys)
        for source in ("mscoco", "vg", "vqa", "gqa", "vgqa", "cc3m"):
            want = sum(len(im[source]) for im in expected[split].values())
            assert split_stats["sentences"][source] == want, (split, source)
            assert split_stats["images_by_source"][source] == sum(
                1 for im in expected[split].values() if im[source]), (split, source)
        for record in records:
            want = expected[split][record["image"]]
            assert record["sentences"] == {s: [t for t, _ in v] for s, v in want.items() if v}
            for source in QA:
                if want[source]:
                    assert record["answers"][source] == [
                        {a: score for a, score in answers.items() if a in table}
                        for _, answers in want[source]]
    # Only answers of minival questions can miss the table in this small world.
    assert not table - {a for split in ("train", "nominival", "vgnococo")
                        for im in expected[split].values()
                        for source in QA for _, answers in im[source] for a in answers}


def test_minival_is_held_out_of_every_other_split_and_the_answer_table(world, corpus):
    expected, held_out = expected_from_raw(world)
    minival = {r["image"] for r in load_split(corpus, "minival")}
    assert minival == {f"coco-{i}" for i in held_out}
    for split in ("train", "nominival", "vgnococo", "cc3m"):
        assert not minival & {r["image"] for r in load_split(corpus, split)}
    # The table is exactly the ranking of the answers of the non-minival questions.
    counts, dsets = Counter(), defaultdict(set)
    for split in ("train", "nominival", "vgnococo"):
        for image in expected[split].values():
            for source in QA:
                for _, answers in image[source]:
                    counts.update(answers.keys())
                    for a in answers:
                        dsets[a].add(source)
    ranked = sorted(counts, key=lambda a: (-counts[a], a))
    assert _load(corpus / "answers.json") == [{"ans": a, "dsets": sorted(dsets[a])}
                                              for a in ranked]
    assert load_stats(corpus)["answers"] == len(ranked)


def _set_vqa_answers(root, coco_ids, answer):
    path = root / "vqa/v2_mscoco_val2014_annotations.json"
    data = _load(path)
    changed = 0
    for ann in data["annotations"]:
        if ann["image_id"] in coco_ids:
            ann["answers"] = [{**a, "answer": answer} for a in ann["answers"]]
            changed += 1
    path.write_text(json.dumps(data))
    assert changed


def test_minival_answers_do_not_change_answers_json(world, corpus, tmp_path):
    _, held_out = expected_from_raw(world)
    val = sorted(e["id"] for e in _load(world / "coco/annotations/captions_val2014.json")["images"])
    nominival = [i for i in val if i not in held_out]
    root = _copy_annotations(world, tmp_path / "w1")
    _set_vqa_answers(root, held_out, "zzminival")
    build_corpus(_config(root), tmp_path / "c1", progress=False, echo=lambda _: None)
    assert (tmp_path / "c1/answers.json").read_bytes() == (corpus / "answers.json").read_bytes()
    minival = list(load_split(tmp_path / "c1", "minival"))
    assert all(a == {} for r in minival for a in r["answers"]["vqa"])
    # The control: the same change on a nominival image does reach the table.
    root = _copy_annotations(world, tmp_path / "w2")
    _set_vqa_answers(root, nominival[:1], "zznominival")
    build_corpus(_config(root), tmp_path / "c2", progress=False, echo=lambda _: None)
    assert "zznominival" in [e["ans"] for e in _load(tmp_path / "c2/answers.json")]


def test_vg_and_gqa_text_of_coco_images_is_keyed_by_coco_id(world, corpus):
    records = {r["image"]: (split, r) for split in split_names(corpus)
               for r in load_split(corpus, split)}
    coco_split = {}
    for subset in ("train", "val"):
        for image in _load(world / f"coco/annotations/captions_{subset}2014.json")["images"]:
            coco_split[image["id"]] = subset
    phrases = {e["id"]: [r["phrase"] for r in e["regions"]]
               for e in _load(world / "vg/region_descriptions.json")}
    gqa = defaultdict(list)
    for q in _load(world / "gqa/train_balanced_questions.json").values():
        gqa[int(q["imageId"])].append(q["question"])
    with_coco = 0
    for entry in _load(world / "vg/image_data.json"):
        vg_id, coco_id = entry["image_id"], entry["coco_id"]
        if coco_id is None:
            split, record = records[f"vg-{vg_id}"]
            assert split == "vgnococo"
        else:
            with_coco += 1
            assert f"vg-{vg_id}" not in records
            split, record = records[f"coco-{coco_id}"]
            assert split == "train" if coco_split[coco_id] == "train" else split in (
                "nominival", "minival")
        assert record["sentences"]["vg"] == phrases[vg_id]
        assert set(gqa[vg_id]) <= set(record["sentences"]["gqa"])
    assert with_coco > 0


def test_cc3m_keys_are_the_extractor_keys_of_downloaded_images(world, corpus):
    refs = list_cc3m(world / "cc3m")
    keys = [r["image"] for r in load_split(corpus, "cc3m")]
    assert keys == sorted(f"cc3m-{ref.image_id}" for ref in refs)
    rows = [row for p in (world / "cc3m").glob("*.parquet")
            for row in pq.ParquetFile(p).read().to_pylist()]
    failed = {f"cc3m-{row['key']}" for row in rows if row["status"] != "success"}
    assert failed and not failed & set(keys)


def test_text_is_the_training_captions(world, corpus, tmp_path):
    expected, _ = expected_from_raw(world)
    lines = list(load_text(corpus))
    want = [t for split in ("train", "nominival", "vgnococo", "cc3m")
            for key in sorted(expected[split])
            for source in ("mscoco", "vg", "cc3m") for t, _ in expected[split][key][source]]
    assert lines == [" ".join(t.split()) for t in want]
    book = tmp_path / "book.txt"
    book.write_text("Call me Ishmael.\n\n  Some years ago  \n")
    build_corpus(_config(world, f"text_files=[{book}]"), tmp_path / "c", progress=False,
                 echo=lambda _: None)
    assert list(load_text(tmp_path / "c")) == ["Call me Ishmael.", "Some years ago"]


def test_same_inputs_same_bytes_and_rebuild_replaces(world, corpus, tmp_path):
    out = tmp_path / "again"
    build_corpus(_config(world), out, progress=False, echo=lambda _: None)
    names = sorted(p.name for p in corpus.iterdir())
    assert names == sorted(p.name for p in out.iterdir())
    assert names == ["answers.json", "cc3m.jsonl", "corpus.yaml", "minival.jsonl",
                     "nominival.jsonl", "stats.json", "text.txt", "train.jsonl", "vgnococo.jsonl"]
    for name in names:
        assert (out / name).read_bytes() == (corpus / name).read_bytes(), name
    # Building into an existing corpus replaces it (with overwrite); nothing else is left beside it.
    build_corpus(_config(world, "sources=[mscoco]"), out, overwrite=True, progress=False,
                 echo=lambda _: None)
    assert load_stats(out)["splits"]["train"]["sentences"] == {"mscoco": 120}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]
    assert resolve(CorpusConfig(), out / "corpus.yaml").sources == ("mscoco",)


def test_cli_builds_and_prints_the_table(world, corpus, tmp_path, capsys):
    out = tmp_path / "cli"
    code = main(["corpus", "build", "--config", str(WORLD_CONFIG), "--root", str(world),
                 "--set", f"minival_images={MINIVAL}", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert (out / "train.jsonl").read_bytes() == (corpus / "train.jsonl").read_bytes()
    stats = load_stats(out)
    lines = printed.splitlines()
    header = [c.strip() for c in lines[0].split("|")]
    assert header == ["", "train", "nominival", "minival", "vgnococo", "cc3m", "total"]
    rows = {line.split("|")[0].strip(): [c.split() for c in line.split("|")[1:]]
            for line in lines[2:] if "|" in line}
    splits = stats["splits"]
    for source in ("mscoco", "vg", "vqa", "gqa", "vgqa", "cc3m"):
        for cell, split in zip(rows[source], splits):
            assert cell == [f"{splits[split]['images_by_source'][source]:,}",
                            f"{splits[split]['sentences'][source]:,}"]
    total = sum(sum(s["sentences"].values()) for s in splits.values())
    assert rows["all"][-1] == [f"{sum(s['images'] for s in splits.values()):,}", f"{total:,}"]
    assert f"answers: {stats['answers']:,}" in printed


def test_cli_unknown_set_key_is_an_error(world, tmp_path, capsys):
    code = main(["corpus", "build", "--config", str(WORLD_CONFIG), "--root", str(world),
                 "--set", "minival_image=2", "--out", str(tmp_path / "x")])
    assert code == 2
    assert "unknown config key 'minival_image'; did you mean 'minival_images'" in (
        capsys.readouterr().err)
    assert not (tmp_path / "x").exists()


def test_lxmert_config_on_the_world_layout(world, tmp_path, capsys):
    out = tmp_path / "lx"
    assert main(["corpus", "build", "--config", str(LXMERT_CONFIG), "--root", str(world),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    # 5000 > the world's val2014 images: all of them are minival, with a note.
    assert "note: minival_images is 5000 but val2014 has 4 images" in printed
    stats = load_stats(out)
    assert list(stats["splits"]) == ["train", "nominival", "minival", "vgnococo"]
    assert stats["splits"]["minival"]["images"] == 4 and stats["splits"]["nominival"]["images"] == 0
    config = resolve(CorpusConfig(), LXMERT_CONFIG)
    assert (config.max_answers, config.minival_images) == (9500, 5000)


def _corrupt(path, text):
    path.write_text(text)


def test_every_missing_file_is_named_at_once(world, tmp_path):
    root = _copy_annotations(world, tmp_path / "w")
    gone = ["vg/region_descriptions.json", "coco/annotations/captions_train2014.json",
            "vqa/v2_OpenEnded_mscoco_train2014_questions.json",
            "vqa/v2_mscoco_val2014_annotations.json", "vg/image_data.json"]
    for relative in gone:
        (root / relative).unlink()
    with pytest.raises(CorpusError) as err:
        build_corpus(_config(root), tmp_path / "out", progress=False, echo=lambda _: None)
    assert str(err.value).startswith("5 configured file(s) not found")
    assert all(str(root / relative) in str(err.value) for relative in gone)


@pytest.mark.parametrize(
    "relative, text, message",
    [
        ("vg/region_descriptions.json", None, "1 configured file(s) not found"),
        ("vg/region_descriptions.json", '[{"id": 1, "regions": [', "not valid JSON"),
        ("vg/image_data.json", '{"image_id": 1}', "expected a JSON list at the top level"),
        ("vg/question_answers.json", '[{"qas": []}]', "entry 0 has no int 'id' or 'image_id'"),
        ("gqa/val_balanced_questions.json", '{"7": {"question": "Q?", "answer": "a"}}',
         "question 7 has no str 'imageId'"),
        ("coco/annotations/captions_train2014.json", '{"images": {}}',
         "expected a list under 'images'"),
        ("vqa/v2_mscoco_train2014_annotations.json", '{"annotations": []}',
         "no annotation for question"),
        ("vg/region_descriptions.json", '[{"id": 999, "regions": [{"phrase": "a cat"}]}]',
         "Visual Genome image 999 is not in"),
        ("cc3m/00000.tar", "not a tar", "not a readable img2dataset tar"),
    ],
)
def test_bad_input_names_the_file(world, tmp_path, capsys, relative, text, message):
    root = _copy_annotations(world, tmp_path / "w")
    if text is None:
        (root / relative).unlink()
    else:
        _corrupt(root / relative, text)
    with pytest.raises(CorpusError) as err:
        build_corpus(_config(root), tmp_path / "out", progress=False, echo=lambda _: None)
    assert message in str(err.value) and str(root / relative) in str(err.value)
    # Nothing is left behind: no corpus, no partial directory.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]
    code = main(["corpus", "build", "--config", str(WORLD_CONFIG), "--root", str(root),
                 "--out", str(tmp_path / "out")])
    assert code == 2 and str(root / relative) in capsys.readouterr().err


def test_an_existing_corpus_is_replaced_only_with_overwrite(world, corpus, tmp_path, capsys):
    out = tmp_path / "cli"
    shutil.copytree(corpus, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    argv = ["corpus", "build", "--config", str(WORLD_CONFIG), "--root", str(world), "--set",
            "sources=[mscoco]", "--out", str(out)]
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"pipeline: corpus error: {out}: holds a corpus already; "
                                       "pass --overwrite to replace it, or choose another --out\n")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main([*argv, "--overwrite"]) == 0
    assert resolve(CorpusConfig(), out / "corpus.yaml").sources == ("mscoco",)


def test_vqa_annotation_of_a_question_not_asked_is_refused(world, tmp_path, capsys):
    root = _copy_annotations(world, tmp_path / "w")
    annotations = root / "vqa" / "v2_mscoco_val2014_annotations.json"
    data = _load(annotations)
    data["annotations"].append({**data["annotations"][0], "question_id": 987654321})
    annotations.write_text(json.dumps(data))
    questions = root / "vqa" / "v2_OpenEnded_mscoco_val2014_questions.json"
    with pytest.raises(CorpusError) as err:
        build_corpus(_config(root), tmp_path / "out", progress=False, echo=lambda _: None)
    assert str(err.value) == (f"{annotations}: annotates question 987654321, which is not in "
                              f"{questions} (1 such annotation(s))")
    code = main(["corpus", "build", "--config", str(WORLD_CONFIG), "--root", str(root),
                 "--out", str(tmp_path / "out")])
    # progress bars go to stderr too; the error is its last line
    assert code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"pipeline: corpus error: {err.value}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]


def test_out_that_is_not_a_corpus_is_refused(world, tmp_path):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("do not delete")
    with pytest.raises(CorpusError, match="not a corpus directory"):
        build_corpus(_config(world), out, progress=False, echo=lambda _: None)
    assert (out / "thesis.tex").read_text() == "do not delete"


def test_sources_without_files_are_skipped_and_vg_needs_image_data(world, tmp_path):
    notes = []
    build_corpus(_config(world, "cc3m.shards=null", "gqa.questions=[]"), tmp_path / "c",
                 progress=False, echo=notes.append)
    assert notes == ["note: source gqa: no files configured, skipped",
                     "note: source cc3m: no files configured, skipped"]
    stats = load_stats(tmp_path / "c")
    assert "cc3m" not in stats["splits"] and "gqa" not in stats["splits"]["train"]["sentences"]
    with pytest.raises(CorpusError, match="need vg.image_data"):
        build_corpus(_config(world, "vg.image_data=null"), tmp_path / "d", progress=False)


def test_cc3m_sample_whose_parquet_status_is_not_success_is_left_out(world, tmp_path):
    root = _copy_annotations(world, tmp_path / "w")
    parquet = min((root / "cc3m").glob("*.parquet"))
    table = pq.ParquetFile(parquet).read()
    rows = table.to_pylist()
    victim = next(row for row in rows if row["status"] == "success")
    victim["status"] = "failed_to_resize"
    pq.write_table(table.from_pylist(rows, schema=table.schema), parquet)
    build_corpus(_config(root), tmp_path / "c", progress=False, echo=lambda _: None)
    keys = [r["image"] for r in load_split(tmp_path / "c", "cc3m")]
    assert f"cc3m-{victim['key']}" not in keys
    # The image lister reads the same parquet files: the sample is not extracted either.
    listed = [ref.image_id for ref in list_cc3m(root / "cc3m")]
    assert victim["key"] not in listed and len(keys) == len(listed)


def _annotation_files(world):
    """Every file the world config names, each read once: the JSON files and the CC3M shards."""
    return sorted([*(world / "coco" / "annotations").glob("captions_*.json"),
                   *(world / "vqa").glob("*.json"), *(world / "gqa").glob("*.json"),
                   *(world / "vg" / name for name in ("image_data.json",
                                                      "region_descriptions.json",
                                                      "question_answers.json")),
                   *(world / "cc3m").glob("*.tar")])


def test_progress_in_a_log_is_one_plain_line_per_file_read(world, tmp_path, capsys):
    code = main(["corpus", "build", "--config", str(WORLD_CONFIG), "--root", str(world),
                 "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err  # captured: not a terminal, as a log file or a pipe
    assert code == 0
    assert "\r" not in err
    lines = err.splitlines()
    read = [re.fullmatch(r"reading (.+) \(\d+\.\d MiB\)", line) for line in lines]
    assert all(read), lines
    assert sorted(Path(m.group(1)) for m in read) == _annotation_files(world)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_draws_bars(world, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    build_corpus(_config(world), tmp_path / "c", echo=lambda _: None)
    shown = sys.stderr.getvalue()
    assert "\r" in shown and "region_descriptions.json:" in shown  # a bar, named by its file
    assert f"reading {world / 'cc3m' / '00000.tar'} (" in shown


def test_an_out_under_a_file_fails_before_reading_anything(world, tmp_path, capsys):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a folder")
    out = blocker / "corpus"
    code = main(["corpus", "build", "--config", str(WORLD_CONFIG), "--root", str(world),
                 "--out", str(out)])
    assert code == 2
    # One line: no file was read before it (each read says so on stderr).
    assert capsys.readouterr().err == (
        f"pipeline: corpus error: {out}: cannot be made, {blocker} is a file\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_read_only_out_folder_fails_before_reading_anything(world, tmp_path, capsys,
                                                               monkeypatch):
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        # Root writes into any folder whatever its mode: answer as the kernel answers others.
        make_dir = os.mkdir

        def refuse_in_folder(path, *args, **kwargs):
            if Path(path).parent == folder:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return make_dir(path, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", refuse_in_folder)
    out = folder / "corpus"
    code = main(["corpus", "build", "--config", str(WORLD_CONFIG), "--root", str(world),
                 "--out", str(out)])
    assert code == 2
    assert capsys.readouterr().err == (
        f"pipeline: corpus error: {out}: cannot write into {folder} (Permission denied)\n")
    assert list(folder.iterdir()) == []
