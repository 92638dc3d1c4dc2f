"""Command-line arguments every verb shares: --config / --set, a verb's actions
(`pipeline corpus build`, `pipeline shards verify`, ...), and the check of an --out directory."""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pipeline.common.config import ConfigError
from shards.storage import Location, as_path, is_url, write_atomic


def formatter_for(description: str) -> type[argparse.HelpFormatter]:
    """A description written in paragraphs keeps its lines; a one-paragraph one is wrapped."""
    if "\n" in description.strip():
        return argparse.RawDescriptionHelpFormatter
    return argparse.HelpFormatter


def add_config_args(parser: argparse.ArgumentParser, example: str) -> None:
    """A verb's `--config FILE`, repeatable `--set key=value` (into args.config, args.sets;
    `example` is one of the verb's own keys with a value) and `--show-config` (the verb module's
    `config(args)` printed key by key: pipeline/cli.py)."""
    group = parser.add_argument_group("configuration")
    group.add_argument("--config", metavar="FILE", help="YAML file with config values")
    group.add_argument(
        "--set",
        dest="sets",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        type=_key_value,
        help=f"override one config value, e.g. --set {example} (repeatable; applied after "
        "--config; unknown keys are errors; --show-config lists every key)",
    )
    group.add_argument(
        "--show-config", action="store_true",
        help="print every config key with its value (after --config and --set) and its meaning, "
        "then exit without running",
    )


def _key_value(text: str) -> str:
    """--set's argument: KEY=VALUE in one word (`--set data.corpus corpus` is an error of the
    verb's, not a stray argument that the top-level parser reports with its own usage)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(
            f"expects KEY=VALUE in one word, got {text!r} (e.g. --set {text}=VALUE)"
        )
    return text


class Actions:
    """The actions of a verb: `Actions(parser, "corpus_verb").add("build", help, description)`
    returns the action's parser; the chosen action's name lands in args.<dest>."""

    def __init__(self, parser: argparse.ArgumentParser, dest: str, metavar: str = "ACTION"):
        self.actions = parser.add_subparsers(dest=dest, metavar=metavar, required=True)

    def add(self, name: str, help: str, description: str, *,
            example: str | None = None) -> argparse.ArgumentParser:
        """The parser of action `name`, taking --config, --set and --show-config when `example`
        (one of its keys with a value, for --set's help) is given (their "configuration" group
        lists after the action's own options whenever they are added)."""
        parser = self.actions.add_parser(name, help=help, description=description,
                                         formatter_class=formatter_for(description))
        if example is not None:
            add_config_args(parser, example)
        return parser


def writable_dir(path: str | Path) -> Location:
    """The --out directory `path`, created if needed and written to once (a file made and removed):
    a read-only place is one ConfigError here, not a traceback later (from a Ray worker, say).
    For a URL, the object written and removed also checks the credentials and the bucket."""
    path = as_path(path)
    if is_url(path):
        probe = path / ".write-check"
        try:
            write_atomic(probe, b"")
            probe.unlink()
        except Exception as err:  # fsspec's filesystems raise their own errors (botocore's, ...)
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ConfigError(f"--out {path}: cannot write there ({reason})") from None
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as err:
        raise ConfigError(f"--out {path}: cannot write there ({err.strerror})") from None
    return path


@contextlib.contextmanager
def checked_out_dir(path: str | Path) -> Iterator[Location]:
    """writable_dir(path) for a command whose other checks follow: when they fail, a local
    directory this made is removed again if still empty (a refused command leaves nothing)."""
    local = not is_url(path)
    made = local and not as_path(path).exists()
    location = writable_dir(path)
    try:
        yield location
    except BaseException:
        if made and not any(location.iterdir()):
            location.rmdir()
        raise
