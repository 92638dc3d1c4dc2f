"""What every stage uses: configuration, devices, the Ray session, the text side, bundled assets.

config.py       frozen dataclasses <- YAML + `--set`; ConfigError; absolute paths
arguments.py    the --config / --set arguments every verb takes, a verb's actions, a writable --out
devices.py      "auto" / "cpu" / "cuda[:N]" -> a torch device; torch CPU threads per worker
ray_session.py  join a Ray cluster or start a local one for a run (Ray imported only then)
text.py         the BERT WordPiece tokenizer and (B, T) id tensors
assets.py       the bundled world detector, sample photographs and shipped configs
signals.py      SIGTERM (a scheduler's) taken as Ctrl-C is: Terminated, exit 143
"""
