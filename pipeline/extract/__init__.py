"""`pipeline extract`, `pipeline show`, `pipeline shards`: images -> feature shards, and looking at them.

config.py          ExtractJobConfig: the extractor's config + engine + output; presets, --set
plan.py            the shard plan and its units (detector batches), the same for both engines
steps.py           what both engines do to a batch: prepare (read, decode, resize), detect
detector.py        the run's detector (built once per process or Ray actor) and its record
output.py          the output directory: lock, config check, extract.log, ShardSink, summary
progress.py        the progress bar: images written, the stage of the batch in hand
local.py           the local engine: one process, decoding threads
ray_engine.py      the Ray engine: Ray Data decode tasks and detector actors
job.py             an extraction run: plan -> engine -> shards, resumable
show.py            one sample's regions drawn on its image
command.py, show_command.py, shards_command.py    the verbs
"""
