"""pipeline.pretrain.data: corpus pairs, their join with feature shards, the per-rank training
stream (exactly-once per epoch, equal steps, determinism, exact resume, bounded memory), the
validation order and the text-only stream. Shards and corpus are tiny and written here."""

from __future__ import annotations

import gc
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from pipeline.corpus.config import CorpusError
from pipeline.corpus.pair_table import PairTableBuilder
from pipeline.corpus.pairs import Pair
from pipeline.corpus.read import load_answers, load_pairs
from pipeline.pretrain.data import JoinError, PretrainStream, TextStream, ValidationStream
from shards.schema import Sample, SchemaError, build_sample, make_key
from shards.writer import ShardWriter

ANSWERS = ["yes", "no", "2", "red"]
SHARDS = 4
PER_SHARD = 5  # coco images 0..19, five per shard; shard 3 also holds vg-100 (no text)
TRAIN = [*range(18), 20, 21]  # 20 and 21 have no features
MINIVAL = [18, 19]


def num_boxes(i: int) -> int:
    return 3 + i % 4


def fake_sample(dataset: str, image_id: int) -> Sample:
    """Sample whose features name it: row k of image i is i * 10 + k everywhere."""
    n = num_boxes(image_id)
    features = (image_id * 10 + np.arange(n, dtype=np.float32))[:, None].repeat(4, axis=1)
    return build_sample(
        dataset=dataset, image_id=str(image_id), split="train", width=10, height=10,
        boxes=np.tile(np.array([0, 0, 5, 5], np.float32), (n, 1)), object_ids=np.arange(n),
        object_conf=np.linspace(1, 0.1, n), attr_ids=np.zeros(n), attr_conf=np.zeros(n),
        features=features.astype(np.float16), box_mode="adaptive", preset="test",
        detector={"name": "t", "config_hash": "0", "weights_hash": "0"}, params={},
    )


def write_shards(out: Path) -> dict[Path, list[str]]:
    """The shards and their keys in file order."""
    keys = {}
    for s in range(SHARDS):
        with ShardWriter(out, f"{s:05d}") as writer:
            samples = [fake_sample("coco", i) for i in range(s * PER_SHARD, (s + 1) * PER_SHARD)]
            if s == SHARDS - 1:
                samples.append(fake_sample("vg", 100))
            for sample in samples:
                writer.write(sample)
        keys[writer.path] = [sample.key for sample in samples]
    return keys


def captions(i: int) -> list[str]:
    return [f"caption {j} of image {i}" for j in range(1 + i % 3)]


def questions(i: int) -> list[str]:
    return [f"question {j} about {i}" for j in range(1 + (i % 4) // 2)] if i % 2 == 0 else []


def expected_answers(i: int, j: int) -> dict[int, float]:
    return {(i + j) % 4: 1.0, (i + j + 1) % 4: 0.3}


def corpus_line(i: int) -> dict:
    line = {"image": make_key("coco", str(i)), "sentences": {"mscoco": captions(i)}}
    if questions(i):
        line["sentences"]["vqa"] = questions(i)
        line["answers"] = {"vqa": [
            {ANSWERS[a]: s for a, s in expected_answers(i, j).items()}
            for j in range(len(questions(i)))
        ]}
    return line


def write_corpus(root: Path, splits: dict[str, list[int]] | None = None) -> Path:
    splits = splits or {"train": TRAIN, "minival": MINIVAL}
    root.mkdir(parents=True, exist_ok=True)
    (root / "answers.json").write_text(json.dumps([{"ans": a, "dsets": ["vqa"]} for a in ANSWERS]))
    for split, images in splits.items():
        lines = sorted((corpus_line(i) for i in images), key=lambda d: d["image"])
        (root / f"{split}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    return root


@pytest.fixture
def data(tmp_path):
    shard_keys = write_shards(tmp_path / "shards")
    corpus = write_corpus(tmp_path / "corpus")
    return corpus, shard_keys, load_pairs(corpus, ["train"])


def stream(data, **kwargs) -> PretrainStream:
    corpus, shard_keys, pairs = data
    options = dict(batch_size=2, shuffle_buffer=4) | kwargs
    return PretrainStream(list(shard_keys), pairs, corpus_dir=corpus, **options)


def ident(pair) -> tuple[str, str, str]:
    """A pair's identity: its image, source and sentence (each unique in the test corpus; pairs
    are made at each lookup of the corpus table, and hold dicts, so no hash)."""
    return pair.image, pair.source, pair.sentence


def row_ids(batches) -> list[list[tuple[tuple[str, str, str], str]]]:
    """Each row as (the Pair's identity, its sample's key)."""
    return [[(ident(pair), sample.key) for pair, sample in batch] for batch in batches]


# --- corpus ---------------------------------------------------------------------------------


def test_load_pairs_orders_maps_answers_and_shares_captions(tmp_path):
    corpus = write_corpus(tmp_path)
    pairs = load_pairs(corpus, ["train", "minival"])
    assert list(pairs) == sorted(make_key("coco", str(i)) for i in TRAIN) + ["coco-18", "coco-19"]
    for i in TRAIN + MINIVAL:
        got = pairs[make_key("coco", str(i))]
        assert [(p.source, p.sentence) for p in got] == (
            [("mscoco", c) for c in captions(i)] + [("vqa", q) for q in questions(i)]
        )
        assert all(p.image == make_key("coco", str(i)) for p in got)
        assert got[0].image_sentences == tuple(captions(i))
        assert all(p.image_sentences is got[0].image_sentences for p in got)
        assert [p.answers for p in got] == [None] * len(captions(i)) + [
            expected_answers(i, j) for j in range(len(questions(i)))
        ]
    assert pairs["coco-2"][-2].answers == {2: 1.0, 3: 0.3}  # "2" and "red": answers.json order
    assert load_answers(corpus).answers == tuple(ANSWERS)


def test_load_pairs_source_filter_keeps_all_captions_in_image_sentences(tmp_path):
    corpus = write_corpus(tmp_path)
    pairs = load_pairs(corpus, "train", sources=["vqa"])
    assert list(pairs) == sorted(make_key("coco", str(i)) for i in TRAIN if questions(i))
    assert {p.source for ps in pairs.values() for p in ps} == {"vqa"}
    assert pairs["coco-2"][0].image_sentences == tuple(captions(2))
    with pytest.raises(CorpusError, match=r"unknown sources \['vqa2'\]"):
        load_pairs(corpus, ["train"], sources=["vqa2"])


def test_load_pairs_holds_no_object_per_pair_and_counts_without_making_them(tmp_path):
    corpus = write_corpus(tmp_path)
    gc.collect()
    before = sum(isinstance(o, Pair) for o in gc.get_objects())
    pairs = load_pairs(corpus, ["train", "minival"])
    gc.collect()
    assert sum(isinstance(o, Pair) for o in gc.get_objects()) == before
    assert {k: pairs.count(k) for k in pairs} == {k: len(v) for k, v in pairs.items()}
    assert pairs.count("coco-999") == 0 and "coco-999" not in pairs
    assert pairs.nbytes < 200 * sum(map(pairs.count, pairs))  # text and a few numbers a pair


def test_answer_scores_come_back_exact_from_two_byte_codes():
    from pipeline.corpus.pair_table import MAX_SCORES

    table = PairTableBuilder(None)
    scores = [0.1 * k for k in range(300)] + [1 / 3, 2 / 3, 1e-300, 0.0]
    table.add("vg-1", [("vgqa", f"q{k}", {k: s}) for k, s in enumerate(scores)]
              + [("vg", "a caption", None), ("vgqa", "no answer in the table", {})])
    table.add("vg-2", [("vgqa", "again", {7: scores[7], 1: scores[300]})])
    pairs = table.table()
    assert [p.answers for p in pairs["vg-1"]] == [
        *({k: s} for k, s in enumerate(scores)), None, {}]
    assert pairs["vg-2"][0].answers == {7: scores[7], 1: scores[300]}
    assert pairs.answer_code.dtype == np.uint16 and len(pairs.scores) == len(set(scores))
    many = PairTableBuilder(None)
    with pytest.raises(CorpusError, match="more than 65,536 distinct answer scores"):
        many.add("vg-3", [("vgqa", "q", {k: k + 0.5 for k in range(MAX_SCORES + 1)})])


def test_load_pairs_errors_name_the_file_and_line(tmp_path):
    corpus = write_corpus(tmp_path)
    missing = r"nominival\.jsonl: no such split file.*'minival', 'train'"
    with pytest.raises(CorpusError, match=missing):
        load_pairs(corpus, ["nominival"])
    lines = (corpus / "train.jsonl").read_text().splitlines()
    (corpus / "bad.jsonl").write_text("\n".join([lines[0], lines[1], "{not json"]) + "\n")
    with pytest.raises(CorpusError, match=r"bad\.jsonl:3: not JSON"):
        load_pairs(corpus, ["bad"])
    line = corpus_line(0)
    line["answers"]["vqa"][0]["maybe"] = 0.6
    (corpus / "odd.jsonl").write_text(json.dumps(corpus_line(1)) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(CorpusError, match=r"odd\.jsonl:2: coco-0: vqa answer 'maybe' is not in .*"
                                          r"answers\.json"):
        load_pairs(corpus, ["odd"])
    line = corpus_line(0)
    line["answers"]["vqa"] = []
    (corpus / "short.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(CorpusError, match=r"short\.jsonl:1: .*one per sentence"):
        load_pairs(corpus, ["short"])


# --- training stream ------------------------------------------------------------------------


def test_each_pair_at_most_once_per_epoch_equal_steps_exact_batches(data):
    corpus, shard_keys, pairs = data
    streams = [stream(data, rank=r, world_size=2) for r in range(2)]
    all_pairs = {ident(p): p for ps in pairs.values() for p in ps}
    assert len(all_pairs) == sum(map(len, pairs.values()))  # identities are unique
    for epoch in range(3):
        shards = [set(s.shards_in_epoch(epoch)) for s in streams]
        assert not shards[0] & shards[1] and shards[0] | shards[1] == set(shard_keys)
        # steps from the test's own count of each rank's pairs
        counts = [sum(len(pairs.get(k, ())) for p in sh for k in shard_keys[p]) for sh in shards]
        steps = min(counts) // 2
        assert [s.steps_in_epoch(epoch) for s in streams] == [steps, steps]
        seen = []
        for rank, s in enumerate(streams):
            batches = list(s.batches(epoch))
            assert len(batches) == steps and all(len(b) == 2 for b in batches)
            rank_keys = {k for p in shards[rank] for k in shard_keys[p]}
            for pair, sample in (row for b in batches for row in b):
                assert all_pairs[ident(pair)] == pair and sample.key == pair.image in rank_keys
                seen.append(ident(pair))
        assert len(seen) == len(set(seen)) == 2 * steps * 2
    assert streams[0].total_steps(3) == sum(streams[0].steps_in_epoch(e) for e in range(3))


def test_rows_join_the_right_sample(data):
    s = stream(data, max_boxes=4)
    rows = [row for batch in s.batches(0) for row in batch]
    assert rows
    for pair, sample in rows:
        i = int(sample.meta["image_id"])
        assert sample.key == pair.image == make_key("coco", str(i))
        n = min(num_boxes(i), 4)
        assert sample.num_boxes == n and sample.validate() == []
        assert sample.arrays["features"][:, 0].tolist() == [i * 10 + k for k in range(n)]
        if pair.source == "vqa":
            j = questions(i).index(pair.sentence)
            assert pair.answers == expected_answers(i, j)
    by_key = {}
    for _, sample in rows:  # one Sample per image, shared by its pairs
        assert by_key.setdefault(sample.key, sample) is sample


def test_join_report_counts_both_sides(data):
    report = stream(data).report
    # corpus: coco 0..17, 20, 21; shards: coco 0..19 and vg-100
    assert (report.corpus_images, report.shard_images, report.joined_images) == (20, 21, 18)
    assert report.corpus_without_features == 2
    assert report.examples_without_features == ("coco-20", "coco-21")
    assert report.shards_without_text == 3
    assert report.examples_without_text == ("coco-18", "coco-19", "vg-100")
    assert report.joined_pairs == sum(len(captions(i)) + len(questions(i)) for i in range(18))
    assert "2 of 20 corpus images have no features" in report.summary()


def test_same_seed_same_batches_other_epoch_or_seed_other_order(data):
    def run(epoch, **kwargs):
        s = stream(data, rank=1, world_size=2, **kwargs)
        return [[(p.image, p.sentence, smp.arrays["features"].tobytes()) for p, smp in b]
                for b in s.batches(epoch)]

    assert run(0) == run(0)
    assert run(0) != run(1)
    assert run(0) != run(0, seed=1)


@pytest.mark.parametrize("world_size", [1, 2])
def test_resume_equals_the_uninterrupted_tail(data, world_size):
    for rank in range(world_size):
        s = stream(data, rank=rank, world_size=world_size, shuffle_buffer=5, max_boxes=4)
        for epoch in (0, 1):
            full = list(s.batches(epoch))
            steps = s.steps_in_epoch(epoch)
            for start in (1, 2, steps - 1, steps):
                tail = list(s.batches(epoch, start_step=start))
                assert row_ids(tail) == row_ids(full[start:])
                for got, want in zip(tail, full[start:]):
                    for (_, a), (_, b) in zip(got, want):
                        assert a.meta == b.meta
                        assert all(np.array_equal(a.arrays[k], b.arrays[k]) for k in b.arrays)
    with pytest.raises(ValueError, match="start_step"):
        s.batches(0, start_step=s.steps_in_epoch(0) + 1)


def test_a_share_of_the_steps_equals_those_steps_and_reads_only_their_images(data, monkeypatch):
    import pipeline.pretrain.data as stream_module

    s = stream(data, shuffle_buffer=5, max_boxes=4)
    full = list(s.batches(1))
    steps = s.steps_in_epoch(1)
    decoded = []
    real_decode = stream_module.decode_checked
    monkeypatch.setattr(stream_module, "decode_checked",
                        lambda path, key, members: decoded.append(key) or real_decode(
                            path, key, members))
    for start, keep in ((0, {0}), (0, set(range(1, steps, 3))), (2, {2, steps - 1}),
                        (steps - 1, {steps - 1})):
        decoded.clear()
        share = list(s.batches(1, start_step=start, keep=frozenset(keep)))
        assert row_ids(share) == row_ids([full[step] for step in sorted(keep)])
        used = {sample.key for step in keep for _, sample in full[step]}
        # the images of the kept steps, each decoded once, and no other
        assert sorted(decoded) == sorted(used)


def test_a_share_runs_the_buffer_over_a_shard_not_the_epoch(data):
    s = stream(data, shuffle_buffer=4)
    asked = []
    table = s.pairs_by_image
    real_count = table.count
    table.count = lambda key: asked.append(key) or real_count(key)
    every_step = frozenset(range(s.steps_in_epoch(0)))
    try:
        # the first batch of a share of every step; the whole of a share of the first step
        for keep, take in ((every_step, next), (frozenset({0}), list)):
            asked.clear()
            take(s.batches(0, keep=keep))
            # the first shard's images and the few more whose rows enter the buffer of 4 rows
            # before the first shard's last row is out; all 18 of the epoch before
            assert len(asked) <= PER_SHARD + 4 < s.report.joined_images
    finally:
        del table.count


def test_buffer_bounds_the_samples_alive(data):
    buffer, batch_size = 3, 2
    s = stream(data, batch_size=batch_size, shuffle_buffer=buffer)
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is Sample]
    most = 0
    for batch in s.batches(0):
        alive = sum(type(o) is Sample for o in gc.get_objects())
        most = max(most, alive)
        del batch
    # buffer rows + the batch held here + the image being expanded; 18 images are read
    assert 0 < most <= buffer + batch_size + 1


def test_nothing_joins_names_both_sides(data, tmp_path):
    corpus, shard_keys, pairs = data
    table = PairTableBuilder(None)
    for key, kept in pairs.items():
        table.add("vg-" + key.split("-", 1)[1], [(p.source, p.sentence, p.answers) for p in kept])
    renamed = table.table()
    with pytest.raises(JoinError) as e:
        PretrainStream(list(shard_keys), renamed, batch_size=2, corpus_dir=corpus,
                       splits=("train", "nominival"))
    message = str(e.value)
    assert f"corpus images of {corpus} (splits train, nominival) has a sample" in message
    assert str(tmp_path / "shards") in message
    assert "'vg-0'" in message and "'coco-0'" in message


def test_fewer_shards_than_workers(data):
    with pytest.raises(JoinError, match="4 shards for 5 workers"):
        stream(data, world_size=5)


def test_rank_that_cannot_fill_a_batch(data):
    with pytest.raises(JoinError, match="fewer than batch_size 100"):
        stream(data, batch_size=100).steps_in_epoch(0)


def test_corrupt_member_names_shard_and_key(data):
    _, shard_keys, _ = data
    path = sorted(shard_keys)[1]
    with tarfile.open(path) as tar:
        members = [(info, tar.extractfile(info).read()) for info in tar]
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, payload in members:
            if info.name == "coco-7.features.npy":
                payload = b"\x93NUMPY garbage" + bytes(40)
                info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    with pytest.raises(SchemaError, match=rf"{path}: sample 'coco-7' is corrupt"):
        for _ in stream(data, world_size=1).batches(0):
            pass


# --- validation and text --------------------------------------------------------------------


def test_validation_fixed_order_split_over_ranks(tmp_path):
    shard_keys = write_shards(tmp_path / "shards")
    pairs = load_pairs(write_corpus(tmp_path / "corpus"), ["train", "minival"])
    keys = [k for path in sorted(shard_keys) for k in shard_keys[path] if k in pairs]
    expected = []  # four images at a time: their first pairs, then their second pairs, ...
    for first in range(0, len(keys), 4):
        window = keys[first:first + 4]
        for depth in range(max(len(pairs[k]) for k in window)):
            expected += [(ident(pairs[k][depth]), k) for k in window if depth < len(pairs[k])]
    got = []
    for rank in range(2):
        v = ValidationStream(list(shard_keys), pairs, batch_size=4, rank=rank, world_size=2)
        batches = list(v.batches())
        assert len(batches) == v.steps and all(len(b) == 4 for b in batches[:-1])
        assert row_ids(batches) == row_ids(v.batches())  # deterministic
        got += [row for b in row_ids(batches) for row in b]
    assert got == expected


def test_text_stream_pure_deterministic_and_disjoint(tmp_path):
    path = tmp_path / "text.txt"
    lines = [f"passage {i}" for i in range(12)]
    path.write_text("\n".join(lines[:6]) + "\n\n" + "\n".join(lines[6:]))  # blank line, no final \n
    streams = [TextStream(path, batch_size=3, rank=r, world_size=2, seed=7) for r in range(2)]
    assert len(streams[0]) == 12
    cycle = [t for step in (0, 1) for s in streams for t in s.texts(step)]
    assert sorted(cycle) == sorted(lines)  # one cycle: every line once over both ranks
    later = streams[0].texts(9)
    fresh = TextStream(path, batch_size=3, rank=0, world_size=2, seed=7)
    assert fresh.texts(9) == later and fresh.texts(0) == streams[0].texts(0)
    next_cycle = [t for step in (2, 3) for s in streams for t in s.texts(step)]
    assert sorted(next_cycle) == sorted(lines) and next_cycle != cycle
    other_seed = TextStream(path, batch_size=3, rank=0, world_size=2, seed=8)
    assert [other_seed.texts(i) for i in range(2)] != [streams[0].texts(i) for i in range(2)]
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(CorpusError, match=r"empty\.txt: no text lines"):
        TextStream(tmp_path / "empty.txt", batch_size=2)
