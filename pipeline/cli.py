"""`pipeline`: the command line, a table of verbs.

Each verb is a module that offers HELP (one line for the verb list), DESCRIPTION (its --help
text), `add_args(parser)` and `run(args) -> exit status`, and may offer ON_INTERRUPT (what to do
after Ctrl-C, e.g. how to resume); verbs with actions (`pipeline shards verify`) add them as
sub-parsers. A verb with settings (--config, --set) offers `config(args)`, its resolved config,
which `--show-config` prints key by key instead of running (the verb's required options, such as
--out, are not needed then). Verb modules import only light things at the top and the
heavy ones (torch, Ray) inside `run`, so `pipeline --help` is instant.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import signal
import sys
from types import ModuleType

from extractor.errors import WeightsError
from model.errors import CheckpointError
from pipeline.analyze import command as analyze
from pipeline.analyze.entities import EntitiesError
from pipeline.analyze.errors import AnalysisError
from pipeline.analyze.parses import ParserUnavailable
from pipeline.bench import command as bench
from pipeline.common.arguments import formatter_for
from pipeline.common.bytecode import cache_bytecode
from pipeline.common.config import ConfigError
from pipeline.common.config_help import show_config
from pipeline.common.ray_session import RayStartError, check_address
from pipeline.common.signals import Terminated, terminate_as_interrupt
from pipeline.corpus import command as corpus
from pipeline.corpus.config import CorpusError
from pipeline.datasets import DatasetError
from pipeline.demo import demo
from pipeline.detector import command as detector
from pipeline.evaluate.inputs import EvaluationError
from pipeline.extract import command as extract
from pipeline.extract import shards_command as shards
from pipeline.extract import show_command as show
from pipeline.finetune import command as finetune
from pipeline.finetune import evaluate_command as evaluate
from pipeline.finetune import predict_command as predict
from pipeline.finetune.examples import ExamplesError, TaskDataError
from pipeline.pretrain import command as pretrain
from pipeline.train import convert, plot
from pipeline.train.errors import DivergenceError, Stopped
from pipeline.world import command as world
from shards.schema import SchemaError
from shards.storage import StorageError, check_reachable, explain

VERBS: dict[str, ModuleType] = {
    "extract": extract,
    "show": show,
    "shards": shards,
    "bench": bench,
    "world": world,
    "detector": detector,
    "corpus": corpus,
    "pretrain": pretrain,
    "plot": plot,
    "finetune": finetune,
    "predict": predict,
    "evaluate": evaluate,
    "convert": convert,
    "analyze": analyze,
    "demo": demo,
}
# Errors in what the user gave (a config, a dataset, a file): one line on stderr, exit status 2.
USER_ERRORS: dict[type[Exception], str] = {
    ConfigError: "config error",
    DatasetError: "dataset error",
    CorpusError: "corpus error",
    WeightsError: "weights error",
    EvaluationError: "evaluation error",
    ExamplesError: "task data error",
    TaskDataError: "task data error",
    RayStartError: "ray error",
    SchemaError: "shard error",
    CheckpointError: "checkpoint error",
    DivergenceError: "training error",
    AnalysisError: "analysis error",
    EntitiesError: "entities error",
    ParserUnavailable: "parser error",
    StorageError: "storage error",
}
# A file the user named in a place this process may not write (or read), e.g. a read-only --out,
# or that does not exist (a mistyped input folder or file).
FILE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR)

DESCRIPTION = """\
The open pipeline for vision-and-language pretraining: raw images in, bottom-up-attention region
features out (WebDataset shards), cross-modal transformers trained on them.

Typical use:
  pipeline demo                                  world -> features -> pretrain -> VQA / NLVR2 scores
  pipeline extract --dataset folder --root IMGS --out FEATS --weights faster_rcnn_from_caffe_attr.pkl
  pipeline shards verify FEATS                   check a shard set end to end
  pipeline bench extract --random-weights        images/s and time per stage
  pipeline bench model --arch lxmert             training samples/s, ours against transformers
  pipeline bench pretrain                        pretraining samples/s, 1 -> 2 Ray Train workers
  pipeline convert model_LXRT.pth --to hf --out DIR   official LXMERT weights -> Hugging Face
  pipeline corpus build --config configs/corpus/lxmert.yaml --root DATA --out CORPUS
                                                 pretraining corpus from the annotation files
  pipeline pretrain --config configs/pretrain/lxmert.yaml --out RUN --set data.corpus=CORPUS ...
                                                 pretrain on shards + corpus (--workers N: Ray Train)
  pipeline plot RUN                              loss curves of a run as a PNG
  pipeline finetune vqa --from RUN/checkpoints/step_N/model --out FT --set data.root=DATA/vqa ...
                                                 fine-tune: VQA, GQA, NLVR2, VCR, RefCOCO+, Flickr30K
  pipeline predict vqa --run FT --subset val2014 --out P.json   submission file of a subset
  pipeline evaluate vqa --predictions P.json --annotations A.json --questions Q.json
                                                 the six benchmarks' official metrics
  pipeline analyze grounding --run RUN --shards FEATS --entities FLICKR30K_ENTITIES --out DIR
                                                 which attention heads ground words in regions
  pipeline analyze cross-modal --run PRETRAIN_RUN --shards FEATS --entities ... --out DIR
                                                 does the masked LM use the image? (and back)
Run `pipeline VERB --help` for each verb's options.
"""


def build_parser(required_options: bool = True) -> argparse.ArgumentParser:
    """The parser of every verb; without `required_options`, no option is required
    (--show-config runs nothing, so needs no --out)."""
    parser = argparse.ArgumentParser(
        prog="pipeline", description=DESCRIPTION, formatter_class=argparse.RawTextHelpFormatter
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for name, module in VERBS.items():
        # a verb may offer its own --help (HELP_ACTION: the demo explains each experiment)
        verb = verbs.add_parser(name, help=module.HELP, description=module.DESCRIPTION,
                                formatter_class=formatter_for(module.DESCRIPTION),
                                add_help=not hasattr(module, "HELP_ACTION"))
        if hasattr(module, "HELP_ACTION"):
            verb.add_argument("-h", "--help", action=module.HELP_ACTION,
                              help="show this help message and exit")
        module.add_args(verb)
        if not required_options:
            _optional(verb)
    return parser


def _optional(parser: argparse.ArgumentParser) -> None:
    """Every option of `parser` and of its actions made optional (positionals stay required)."""
    for action in parser._actions:
        if action.option_strings:
            action.required = False
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _optional(sub)


def urls(args: argparse.Namespace) -> list[str]:
    """The URLs a command line names (its options' and arguments' values)."""
    found = []
    for value in vars(args).values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and re.match(r"[a-zA-Z][\w+.-]*://", item):
                found.append(item)
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    showing = "--show-config" in argv
    args = build_parser(required_options=not showing).parse_args(argv)
    named = urls(args)
    try:
        if showing:
            print(show_config(VERBS[args.verb].config(args)))
            return 0
        for url in named:  # an object store that cannot be used is said at once, not after retries
            check_reachable(url)
        if getattr(args, "address", None):  # so is a cluster address, before the inputs are read
            check_address(args.address)
        return VERBS[args.verb].run(args)
    except Stopped as err:  # a training run's checkpoint after SIGTERM or SIGINT
        print(f"pipeline: {err}", file=sys.stderr)
        return err.status
    except KeyboardInterrupt as err:
        # The verbs leave nothing half-written (shards, checkpoints and corpora are renamed into
        # place when complete): say so, and how to go on, not where the signal landed. SIGTERM
        # (a scheduler's) is taken as Ctrl-C is (pipeline/common/signals.py).
        hint = getattr(VERBS[args.verb], "ON_INTERRUPT", "")
        what = "stopped by SIGTERM" if isinstance(err, Terminated) else "interrupted"
        print(f"pipeline: {what}{'; ' + hint if hint else ''}", file=sys.stderr)
        return 143 if isinstance(err, Terminated) else 130
    except BrokenPipeError:  # `pipeline ... | head` stopped reading: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit
        return 141
    except tuple(USER_ERRORS) as err:
        kind = next(label for error, label in USER_ERRORS.items() if isinstance(err, error))
        print(f"pipeline: {kind}: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if err.errno == errno.ENOSPC:  # nothing torn is kept (shards, checkpoints, metrics)
            hint = getattr(VERBS[args.verb], "ON_INTERRUPT", "")
            print(f"pipeline: no space left on device: {err.filename}; free some"
                  f"{', then ' + hint if hint else ''}", file=sys.stderr)
            return 2
        if err.errno in FILE_ERRNOS:
            where = f"{err.filename}: {err.strerror}" if err.filename else err  # pyarrow's has none
            print(f"pipeline: file error: {where}", file=sys.stderr)
            return 2
        return storage_error(err, named)
    except Exception as err:
        return storage_error(err, named)


def storage_error(err: Exception, named: list[str]) -> int:
    """An object store's failure (a URL in a config, found while working): one line, exit 2;
    anything else raised again."""
    cause = explain(err)
    if cause is None:
        raise err
    where = f"{named[0]}: " if len(named) == 1 else ""
    print(f"pipeline: storage error: {where}{cause}", file=sys.stderr)
    return 2


def command() -> int:
    """The `pipeline` program (pyproject's script): `main` on the command line. Interrupted, its
    exit's clean-up (Ray's, torch's) is not interrupted again by a second Ctrl-C, such as the one
    `uv run` passes on after the terminal's. SIGTERM is taken as Ctrl-C is, exit 143."""
    cache_bytecode(lambda line: print(line, file=sys.stderr))
    terminate_as_interrupt()
    status = main()
    if status in (130, 143):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return status


if __name__ == "__main__":
    sys.exit(command())
