"""`pipeline bench scale`: what listing, planning, extracting and resuming a CC3M download cost as
it grows.

A CC3M root in img2dataset's webdataset layout (`{shard:05d}.tar` of `{key}.jpg/.json/.txt`,
`.parquet`, `_stats.json`; 10,000 urls per tar, every tenth a failed download, as about 10% of
CC3M's urls are dead) is generated at each size with one 32x32 JPEG (644 bytes), so that
disk and decode do not dominate. For each size, on a local disk and, with --s3, on a local S3
server (moto's, which counts every request it serves), a fresh process lists the root
(`--dataset cc3m`'s reader) and plans the run (shards and detector batches) as `pipeline extract`
does, and reports wall time, the process's memory before and at its peak, the bytes it read
(local: the kernel's count; S3: the sum of the byte ranges it asked for) and the requests. The
costs are fitted to `a * n ** k` over the sizes: k is the exponent reported. With
--extract-sizes, those roots are also extracted by each of --engines with a tiny random detector:
from the disk a whole run, a run killed once half its shards are written, then resumed (time to
its first new unit; records and sample digests against the whole run), `shards verify` and
`export-tsv` of the whole run's shards; from the S3 server (--extract-from) a whole run with the
requests it made, and one killed at half and resumed, with the resumed run's requests.
--corpus-pairs, --feed-batches and --pretrain-images measure pretraining's data at LXMERT's size
(scale_corpus.py, scale_pretrain.py), --build-images the building of its corpus from the raw
annotation files (scale_build.py).

The roots are kept in --work and reused by later runs of the same sizes.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from pipeline.bench.growth import exponent, fitted_line
from pipeline.bench.process_memory import memory_mb

URLS_PER_TAR = 10_000  # img2dataset's default --number_sample_per_shard
FAILED_EVERY = 10
SHARD_SIZE = 1000  # output.shard_size's default
BATCH_SIZE = 8
COSTS = ["list_s", "plan_s", "driver_mb", "bytes_read", "requests"]
RANGE = re.compile(r"bytes=(\d+)-(\d+)")
# The fastest honest detector: random weights, ResNet-18 of width 8 on 32-pixel images, one box
# per image, so that listing, decoding, queueing, writing and the status files are what is timed.
TINY_DETECTOR = [
    "detector.depth=18", "detector.width=8", "detector.rpn_hidden=16",
    "detector.rpn_pre_nms_topk=50", "detector.rpn_post_nms_topk=10",
    "detector.pooler_resolution=2", "preprocess.min_size=32", "preprocess.max_size=32",
    "selection.min_boxes=1", "selection.max_boxes=1", "run.batch_size=64",
]
ENGINES = ("local", "ray")

DESCRIPTION = __doc__.split("\n\n")[1].replace("\n", " ")


def url_counts(text: str) -> list[int]:
    """--sizes "10000,100000" -> [10000, 100000]; an argparse error otherwise."""
    try:
        counts = [int(item) for item in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated url counts of at least 1, "
                                         f"such as 10000,100000; got {text!r}")
    return counts


def engine_names(text: str) -> list[str]:
    """--engines "local,ray" -> ["local", "ray"]; an argparse error for another name."""
    names = text.split(",")
    if not names or any(name not in ENGINES for name in names):
        raise argparse.ArgumentTypeError(f"expected engines among {', '.join(ENGINES)}, "
                                         f"comma-separated; got {text!r}")
    return names


def pretrain_images(text: str) -> list[int]:
    """--pretrain-images "3500,180000": comma-separated image counts, each enough for a shard per
    worker; an argparse error otherwise."""
    from pipeline.bench.scale_pretrain import IMAGES_PER_SHARD, MINIVAL, WORKERS

    least = WORKERS * IMAGES_PER_SHARD - MINIVAL
    counts = text.split(",")
    if not all(count.isdigit() and int(count) >= least for count in counts):
        raise argparse.ArgumentTypeError(f"expected comma-separated image counts of at least "
                                         f"{least:,} (a shard of {IMAGES_PER_SHARD:,} for each of "
                                         f"{WORKERS} workers, the minival split's {MINIVAL} "
                                         f"included); got {text!r}")
    return [int(count) for count in counts]


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=url_counts, default="10000,100000,1000000",
                        help="comma-separated url counts (default: 10000,100000,1000000)")
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "vlpipe-bench-scale"),
                        help="where the generated roots are kept (default: $TMPDIR/"
                        "vlpipe-bench-scale)")
    parser.add_argument("--s3", action="store_true",
                        help="also on a local S3 server (needs moto: uv sync --extra test)")
    parser.add_argument("--extract-sizes", metavar="SIZES", type=url_counts,
                        help="also extract roots of these url counts with --engines and a tiny "
                        "random detector (TINY_DETECTOR), whole, then again killed at half its "
                        "shards and resumed (e.g. 1000,10000,100000)")
    parser.add_argument("--engines", type=engine_names, default="local",
                        help="with --extract-sizes: the engines to run, comma-separated (local, "
                        "ray; default: local)")
    parser.add_argument("--extract-from", choices=("disk", "s3", "both"), default="disk",
                        help="with --extract-sizes: extract the roots on the local disk (a whole "
                        "run, a killed one resumed, verify and export-tsv), from the S3 server "
                        "(a whole run and a killed one resumed, with the requests each made: needs "
                        "--s3), or both")
    parser.add_argument("--corpus-pairs", metavar="SIZES", type=url_counts,
                        help="also read LXMERT-shaped corpora of these pair counts (51 an image; "
                        "LXMERT's is 9180000) as pretraining does (pipeline/bench/scale_corpus.py)")
    parser.add_argument("--build-images", metavar="SIZES", type=url_counts,
                        help="also build LXMERT-shaped corpora from raw annotation files of these "
                        "image counts (LXMERT's: 180000) with `pipeline corpus build` "
                        "(pipeline/bench/scale_build.py)")
    parser.add_argument("--feed-batches", metavar="N", type=int, default=0,
                        help="also build N of LXMERT's training batches (256 pairs, 36 x 2048 "
                        "float16 features) in one process, as a data worker does")
    parser.add_argument("--pretrain-images", metavar="SIZES", type=pretrain_images,
                        help="also time a pretraining run's driver and its first worker before "
                        "the first step, over shards of these image counts and 51 pairs an image "
                        "(LXMERT's: 180000; pipeline/bench/scale_pretrain.py)")
    parser.add_argument("--json", metavar="OUT", help="also write every number to this JSON file")
    parser.add_argument("--plot", metavar="PNG", help="draw each cost against the size")
    parser.add_argument("--before", metavar="JSON", help="with --plot: an earlier run's --json, "
                        "drawn dashed beside this one (before and after a change)")
    parser.add_argument("--summary", metavar="PNG", help="measure nothing: draw every cost of the "
                        "--from files against the size, in one picture (scale_plot.py)")
    parser.add_argument("--from", dest="summary_from", metavar="JSON,...",
                        type=lambda text: text.split(","),
                        help="with --summary: earlier runs' --json files, comma-separated")


def tiny_jpeg() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 40, 40)).save(buffer, format="JPEG", quality=50)
    return buffer.getvalue()


def make_root(folder: Path, urls: int, per_tar: int = URLS_PER_TAR) -> Path:
    """An img2dataset CC3M root of `urls` urls, `per_tar` to a shard, in `folder` (made once;
    `done` marks it whole; a shard whose stats file is there, written last, is kept)."""
    from pipeline.world.formats.cc3m import Download, write_shard

    if (folder / "done").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    jpeg = tiny_jpeg()
    for shard, start in enumerate(range(0, urls, per_tar)):
        if (folder / f"{shard:05d}_stats.json").is_file():
            continue
        downloads = [
            Download(url=f"https://example.com/{start + i}.jpg", caption=f"a photo {start + i}",
                     jpeg=jpeg, width=32, height=32)
            if i % FAILED_EVERY != FAILED_EVERY - 1 else
            Download(url=f"https://example.com/{start + i}.jpg", caption="", jpeg=None,
                     error_message="HTTP Error 404: Not Found")
            for i in range(min(per_tar, urls - start))
        ]
        write_shard(folder, shard, downloads)
    (folder / "done").write_text("")
    return folder


def _bytes_read() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def measure(root: str) -> dict:
    """List and plan `root` in this process, as `pipeline extract` does before its first image."""
    import pyarrow.parquet  # noqa: F401  (imported before the baseline: what the lister uses)

    from pipeline.datasets import list_images
    from pipeline.extract.plan import plan_shards, plan_units
    from shards.storage import as_path

    as_path(root).exists()  # a URL's filesystem (s3fs, its event loop) made before the baseline
    before_mb, read_before = memory_mb("VmRSS"), _bytes_read()
    start = time.perf_counter()
    refs = list_images("cc3m", root)
    listed = time.perf_counter()
    gc.freeze()  # as pipeline.extract.job does for the run
    units = plan_units(refs, plan_shards(len(refs), SHARD_SIZE), BATCH_SIZE)
    planned = time.perf_counter()
    peak_mb = memory_mb("VmHWM")
    return {"images": len(refs), "units": len(units), "list_s": listed - start,
            "plan_s": planned - listed, "rss_before_mb": before_mb, "peak_mb": peak_mb,
            "driver_mb": peak_mb - before_mb, "bytes_read": _bytes_read() - read_before}


def measure_extract(root: str, out: str, engine: str) -> dict:
    """`pipeline extract --dataset cc3m` of `root` into `out` (resuming what is there) in this
    process, with TINY_DETECTOR on the CPU and `engine`."""
    from pipeline.extract.config import resolve_job
    from pipeline.extract.job import extract_dataset

    start = time.perf_counter()
    job = resolve_job(None, [*TINY_DETECTOR, f"run.engine={engine}"], device="cpu")
    tally = extract_dataset(job, "cc3m", root, out, show_progress=False)
    first = tally.timeline[0][0] - start if tally.timeline else None
    return {"extracted": tally.ok, "failed": sum(tally.failed.values()),
            "skipped_images": tally.skipped_images, "wall_s": time.perf_counter() - start,
            "first_unit_s": first, "peak_mb": memory_mb("VmHWM")}


def measure_shards(verb: str, out: str) -> dict:
    """`pipeline shards verify` or `export-tsv` of `out` in this process: time, memory growth."""
    from shards.tsv import export_tsv
    from shards.verify import verify_shards

    before_mb, start = memory_mb("VmRSS"), time.perf_counter()
    if verb == "verify":
        if problems := verify_shards(out):
            raise RuntimeError(f"{out}: {len(problems)} problems, the first {problems[0]}")
    else:
        export_tsv(out, Path(out).with_suffix(".tsv"))
    return {"wall_s": time.perf_counter() - start, "driver_mb": memory_mb("VmHWM") - before_mb}


def written(out: Path) -> tuple[dict[str, str], int]:
    """(key -> sample sha256, records) over the complete shards of `out`: a key written twice is
    one key and two records."""
    found: dict[str, str] = {}
    records = 0
    for path in sorted(out.glob("*_stats.json")):
        stats = json.loads(path.read_text())
        found.update(zip(stats["keys"], stats["sample_sha256"], strict=True))
        records += len(stats["keys"])
    return found, records


def kill_at_half(root: str, whole: Path, broken: Path, engine: str,
                 env: dict | None = None) -> int:
    """`root` extracted into `broken` and killed once half the shards of the whole run into
    `whole` are written: the shards written by then."""
    shards = len(list(whole.glob("*_stats.json")))
    command = [sys.executable, "-m", "pipeline.bench.scale", "extract", root, str(broken), engine]
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    while len(list(broken.glob("*_stats.json"))) < shards // 2 and run.poll() is None:
        time.sleep(0.05)
    run.kill()
    run.wait()
    return len(list(broken.glob("*_stats.json")))


def resumed(root: str, whole: Path, broken: Path, engine: str, killed_at: int,
            env: dict | None = None) -> dict:
    """The killed run into `broken` resumed: what it wrote, and whether the samples equal the
    whole run's."""
    numbers = _child("extract", root, str(broken), engine, env=env)
    digests, records = written(broken)
    return {"shards_before": killed_at, "of": len(list(whole.glob("*_stats.json"))), **numbers,
            "records": records, "equal": digests == written(whole)[0]}


def extract_row(root: Path, work: Path, urls: int, engine: str) -> dict:
    """A whole run, then a run killed at half its shards and resumed, with what each wrote."""
    import shutil

    whole, broken = work / f"feats_{urls}_{engine}", work / f"feats_{urls}_{engine}_killed"
    for out in (whole, broken):
        shutil.rmtree(out, ignore_errors=True)
    row = {"urls": urls, **_child("extract", str(root), str(whole), engine)}
    killed_at = kill_at_half(str(root), whole, broken, engine)
    row["resume"] = resumed(str(root), whole, broken, engine, killed_at)
    for verb in ("verify", "export"):
        row[verb] = _child("shards", verb, str(whole))
    whole.with_suffix(".tsv").unlink()
    return row


def _child(*args: str, env: dict | None = None) -> dict:
    """`python -m pipeline.bench.scale ARGS` in a fresh process: its JSON line."""
    done = subprocess.run([sys.executable, "-m", "pipeline.bench.scale", *args],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


class S3Server:
    """moto's S3 server on a free port, recording the requests it serves."""

    def __init__(self, work: Path):
        import socket

        server = Path(sys.executable).parent / "moto_server"
        if not server.exists():
            raise SystemExit("bench scale --s3: moto's server is not installed "
                             "(uv sync --extra test)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.recorded = work / "moto_recording.jsonl"
        self.process = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env={**os.environ,
                                            "MOTO_RECORDER_FILEPATH": str(self.recorded)})
        # The standard variables that point boto and s3fs at it; `env` is this process's with them.
        self.aws = {"AWS_ACCESS_KEY_ID": "moto", "AWS_SECRET_ACCESS_KEY": "moto",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.url}
        self.env = {**os.environ, **self.aws}
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/moto-api/", timeout=2)
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"moto_server did not answer on {self.url}") from None
                time.sleep(0.2)

    def upload(self, folder: Path, bucket: str) -> str:
        """`folder`'s files as s3://bucket/cc3m/..., one at a time (s3fs's recursive put reads
        many files at once into memory: 12 GB for CC3M's 330 tars)."""
        import s3fs

        fs = s3fs.S3FileSystem(key="moto", secret="moto", endpoint_url=self.url)
        fs.mkdir(bucket)
        for path in sorted(folder.iterdir()):
            fs.put_file(str(path), f"{bucket}/cc3m/{path.name}")
        return f"s3://{bucket}/cc3m"

    def _recorder(self, action: str) -> None:
        request = urllib.request.Request(f"{self.url}/moto-api/recorder/{action}", method="POST")
        urllib.request.urlopen(request, timeout=30)

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[dict]]:
        """The requests the server serves inside the block (each as moto's recorder writes it:
        method, headers, ...), in the list yielded once the block ends."""
        requests: list[dict] = []
        self._recorder("reset-recording")
        self._recorder("start-recording")
        try:
            yield requests
        finally:
            self._recorder("stop-recording")
            requests.extend(json.loads(line)
                            for line in self.recorded.read_text().splitlines())

    def measure(self, root: str) -> dict:
        """`measure` in a fresh process, with the requests the server saw meanwhile."""
        with self.recording() as requests:
            numbers = _child(root, env=self.env)
        return {**numbers, **_counted(requests)}

    def measure_extract(self, root: str, out: Path, engine: str) -> dict:
        """A whole extraction of `root` (a URL on this server) into the local folder `out`, in a
        fresh process, with the requests it made; then one killed at half and resumed, with the
        requests of the resumed run (its re-plan and the rest of the images)."""
        import shutil

        broken = out.with_name(out.name + "_killed")
        for folder in (out, broken):
            shutil.rmtree(folder, ignore_errors=True)
        with self.recording() as requests:
            numbers = _child("extract", root, str(out), engine, env=self.env)
        killed_at = kill_at_half(root, out, broken, engine, env=self.env)
        with self.recording() as resumed_requests:
            resume = resumed(root, out, broken, engine, killed_at, env=self.env)
        return {**numbers, **_counted(requests),
                "resume": {**resume, **_counted(resumed_requests)}}

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def _counted(requests: list[dict]) -> dict:
    """Requests (in all and by method) and the bytes their ranges asked for."""
    ranges = [RANGE.search(r["headers"].get("Range", "")) for r in requests]
    return {"requests": len(requests),
            "requests_by_method": {m: sum(r["method"] == m for r in requests)
                                   for m in sorted({r["method"] for r in requests})},
            "bytes_read": sum(int(m[2]) - int(m[1]) + 1 for m in ranges if m)}


def exponents(rows: list[dict], costs: list[str] = COSTS, size: str = "urls") -> dict[str, float]:
    """k of cost ~ n^k (n: each row's `size` field) per cost that every row measured positive."""
    fitted = {cost: exponent([(r[size], r.get(cost)) for r in rows]) for cost in costs}
    return {cost: k for cost, k in fitted.items() if k is not None}


def _table(storage: str, rows: list[dict], fitted: dict[str, float]) -> str:
    lines = [f"{storage}: listing and planning a CC3M root (img2dataset)",
             f"{'urls':>10} {'images':>10} {'list s':>8} {'plan s':>7} {'driver MB':>10} "
             f"{'MB read':>9} {'requests':>9}"]
    for r in rows:
        requests = r.get("requests", "-")
        lines.append(f"{r['urls']:>10,} {r['images']:>10,} {r['list_s']:>8.2f} "
                     f"{r['plan_s']:>7.2f} {r['driver_mb']:>10.0f} {r['bytes_read'] / 1e6:>9.1f} "
                     f"{requests:>9}")
    lines.append(fitted_line(fitted))
    return "\n".join(lines)


def _extract_exponents(rows: list[dict]) -> dict[str, float]:
    """k of the whole run's wall time, the resumed run's time to its first new unit, and the
    times of verify and export-tsv."""
    flat = [{"urls": r["urls"], "wall_s": r["wall_s"],
             "resume_first_unit_s": r["resume"]["first_unit_s"],
             "verify_s": r["verify"]["wall_s"], "export_tsv_s": r["export"]["wall_s"]}
            for r in rows]
    return exponents(flat, ["wall_s", "resume_first_unit_s", "verify_s", "export_tsv_s"])


def _extract_table(engine: str, rows: list[dict], fitted: dict) -> str:
    lines = [f"{engine} engine, tiny random detector: a whole run, then one killed at half and "
             "resumed",
             f"{'urls':>10} {'images':>9} {'wall s':>8} {'img/s':>7} {'peak MB':>8} "
             f"{'killed at':>10} {'first new s':>11} {'records':>8} {'equal':>6}"]
    for r in rows:
        resume = r["resume"]
        lines.append(
            f"{r['urls']:>10,} {r['extracted']:>9,} {r['wall_s']:>8.1f} "
            f"{r['extracted'] / r['wall_s']:>7.0f} {r['peak_mb']:>8.0f} "
            f"{resume['shards_before']:>4}/{resume['of']:<5} {resume['first_unit_s']:>11.2f} "
            f"{resume['records']:>8,} {str(resume['equal']):>6}")
    lines.append(fitted_line(fitted))
    lines.append("pipeline shards verify / export-tsv of the whole run's shards")
    for r in rows:
        lines.append(f"{r['urls']:>10,}  verify {r['verify']['wall_s']:.1f} s "
                     f"(+{r['verify']['driver_mb']:.0f} MB), export-tsv "
                     f"{r['export']['wall_s']:.1f} s (+{r['export']['driver_mb']:.0f} MB)")
    return "\n".join(lines)


def _extract_s3_table(block: dict) -> str:
    lines = [f"{block['engine']} engine from S3 (moto), shards written locally: a whole run, "
             f"then one killed at half and resumed (its requests: the re-plan and the rest)",
             f"{'urls':>10} {'images':>9} {'wall s':>8} {'img/s':>7} {'GETs':>8} "
             f"{'GETs/image':>10} {'MB read':>8} {'killed at':>10} {'first new s':>11} "
             f"{'GETs':>7} {'MB read':>8} {'equal':>6}"]
    for r in block["rows"]:
        gets, resume = r["requests_by_method"].get("GET", 0), r["resume"]
        lines.append(f"{r['urls']:>10,} {r['extracted']:>9,} {r['wall_s']:>8.1f} "
                     f"{r['extracted'] / r['wall_s']:>7.0f} {gets:>8,} "
                     f"{gets / r['extracted']:>10.3f} {r['bytes_read'] / 1e6:>8.1f} "
                     f"{resume['shards_before']:>4}/{resume['of']:<5} "
                     f"{resume['first_unit_s']:>11.2f} "
                     f"{resume['requests_by_method'].get('GET', 0):>7,} "
                     f"{resume['bytes_read'] / 1e6:>8.1f} {str(resume['equal']):>6}")
    lines.append(fitted_line(block["exponents"]))
    return "\n".join(lines)


def _plot(results: dict, path: str, before: dict | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    costs = [("list_s", "listing (s)"), ("driver_mb", "driver memory (MB)"),
             ("bytes_read", "bytes read"), ("requests", "S3 requests")]
    fig, axes = plt.subplots(1, len(costs), figsize=(4 * len(costs), 3.4))
    runs = [("", "-", results)] + ([("before: ", "--", before)] if before else [])
    for ax, (cost, title) in zip(axes, costs):
        for prefix, style, run in runs:
            for color, (storage, block) in zip(("C0", "C1"), run.items()):
                points = [(r["urls"], r[cost]) for r in block["rows"] if r.get(cost)]
                if points:
                    k = block["exponents"].get(cost)
                    label = prefix + storage + (f" (k={k:.2f})" if k is not None else "")
                    ax.loglog(*zip(*points), style, color=color, marker="o", label=label)
        ax.set_title(title)
        ax.set_xlabel("urls")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(args: argparse.Namespace) -> int:
    if args.summary or args.summary_from:
        return _summary(args.summary, args.summary_from)
    before = None
    if args.extract_from != "disk" and not (args.s3 and args.extract_sizes):
        raise SystemExit(f"bench scale: --extract-from {args.extract_from} extracts from the S3 "
                         "server: give --s3 and --extract-sizes too")
    if args.before:  # checked first: the runs take minutes
        if not args.plot:
            raise SystemExit("bench scale: --before draws an earlier run beside this one: give "
                             "--plot PNG too")
        try:
            before = json.loads(Path(args.before).read_text())
        except (OSError, ValueError) as err:
            raise SystemExit(f"bench scale: --before {args.before}: not a --json file of an "
                             f"earlier run ({err})") from None
    sizes = args.sizes
    work = Path(args.work)
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SystemExit(f"bench scale: --work {work}: cannot make it ({err.strerror})") from None
    roots = {urls: make_root(work / f"cc3m_{urls}", urls) for urls in sizes}
    results = {"local": {"rows": [{"urls": urls, **_child(str(roots[urls]))} for urls in sizes]}}
    extracted_s3 = {}
    if args.s3:
        server = S3Server(work)
        try:
            urls_of = {urls: server.upload(roots[urls], f"scale-{urls}") for urls in sizes}
            results["s3"] = {"rows": [{"urls": urls, **server.measure(urls_of[urls])}
                                      for urls in sizes]}
            for engine in args.engines if args.extract_from != "disk" else ():
                rows = []
                for urls in args.extract_sizes:
                    if urls not in urls_of:
                        urls_of[urls] = server.upload(make_root(work / f"cc3m_{urls}", urls),
                                                      f"scale-{urls}")
                    rows.append({"urls": urls, **server.measure_extract(
                        urls_of[urls], work / f"feats_{urls}_{engine}_s3", engine)})
                resumes = [{"urls": r["urls"], "resume_first_unit_s": r["resume"]["first_unit_s"],
                            "resume_requests": r["resume"]["requests"]} for r in rows]
                extracted_s3[f"extract_s3_{engine}"] = {
                    "engine": engine, "rows": rows,
                    "exponents": {**exponents(rows, ["wall_s", "requests", "bytes_read"]),
                                  **exponents(resumes, ["resume_first_unit_s",
                                                        "resume_requests"])}}
        finally:
            server.close()
    for storage, block in results.items():
        block["exponents"] = exponents(block["rows"])
        print(_table(storage, block["rows"], block["exponents"]))
    for block in extracted_s3.values():
        print(_extract_s3_table(block))
    results.update(extracted_s3)
    if args.extract_sizes and args.extract_from != "s3":
        for engine in args.engines:
            rows = [extract_row(make_root(work / f"cc3m_{urls}", urls), work, urls, engine)
                    for urls in args.extract_sizes]
            block = results["extract" if engine == "local" else f"extract_{engine}"] = {
                "engine": engine, "rows": rows, "exponents": _extract_exponents(rows)}
            print(_extract_table(engine, rows, block["exponents"]))
    if args.corpus_pairs:
        from pipeline.bench.scale_corpus import CORPUS_COSTS, corpus_table, make_corpus

        block = results["corpus"] = _sized(
            [_child("corpus", str(make_corpus(work / f"corpus_{pairs}", pairs)))
             for pairs in args.corpus_pairs], "pairs", CORPUS_COSTS)
        print(corpus_table(block["rows"], block["exponents"]))
    if args.build_images:
        from pipeline.bench.scale_build import BUILD_COSTS, build_table, make_annotations

        block = results["build"] = _sized(
            [_child("build", str(make_annotations(work / f"build_{images}", images)))
             for images in args.build_images], "images", BUILD_COSTS)
        print(build_table(block["rows"], block["exponents"]))
    if args.feed_batches:
        from pipeline.bench.scale_corpus import make_feed_world

        feed = _child("feed", str(make_feed_world(work / "feed_lxmert")), str(args.feed_batches))
        results["feed"] = feed
        print(f"feed: {feed['pairs']:,} pairs in {feed['batches']} batches of LXMERT's: "
              f"{feed['pairs_per_s']:,.0f} pairs/s in one process (+{feed['feed_mb']:.0f} MB "
              f"while feeding, its peak then {feed['process_mb']:.0f} MB)")
    if args.pretrain_images:
        from pipeline.bench.scale_pretrain import (
            PRETRAIN_COSTS, make_pretrain_world, pretrain_row, pretrain_table,
        )

        rows = []
        for images in args.pretrain_images:
            world = str(make_pretrain_world(work / f"pretrain_{images}", images))
            rows.append(pretrain_row(images, _child("pretrain-driver", world),
                                     _child("pretrain-worker", world),
                                     _child("pretrain-worker", world, "off-host")))
        block = results["pretrain"] = _sized(rows, "images", PRETRAIN_COSTS)
        print(pretrain_table(block["rows"], block["exponents"]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    if args.plot:
        _plot(results, args.plot, before)
    return 0


def _sized(rows: list[dict], size: str, costs: list[str]) -> dict:
    """A block of rows of several sizes (each row's `size` field) and its costs' exponents."""
    return {"rows": rows, "exponents": exponents(rows, costs, size)}


def _summary(png: str | None, paths: list[str] | None) -> int:
    from pipeline.bench.scale_plot import plot_summary

    if not (png and paths):
        raise SystemExit("bench scale: --summary PNG draws the --from JSON files: give both")
    for path in paths:
        try:
            if not isinstance(json.loads(Path(path).read_text()), dict):
                raise ValueError("not an object of blocks")
        except (OSError, ValueError) as err:
            raise SystemExit(f"bench scale --from {path}: not a --json file ({err})") from None
    try:
        plot_summary(paths, png)
    except OSError as err:
        raise SystemExit(f"bench scale --summary {png}: cannot write it ({err.strerror})") from None
    print(f"wrote {png}")
    return 0


def _measured(argv: list[str]) -> dict:
    """What a fresh process (`_child`) measures: `VERB ARGS`, or `ROOT` to list and plan."""
    from pipeline.bench import scale_build, scale_corpus, scale_pretrain

    verbs = {"extract": measure_extract, "shards": measure_shards,
             "corpus": scale_corpus.measure_corpus, "build": scale_build.measure_build,
             "feed": lambda world, batches: scale_corpus.measure_feed(world, int(batches)),
             "pretrain-driver": scale_pretrain.measure_driver,
             "pretrain-worker": scale_pretrain.measure_worker}
    if argv[0] in verbs:
        return verbs[argv[0]](*argv[1:])
    return measure(argv[0])


if __name__ == "__main__":
    print(json.dumps(_measured(sys.argv[1:])))
