"""The pipeline: the stages that drive the libraries (`extractor`, `model`, `shards`), and the
`pipeline` command line. docs/architecture.md draws the map; LAYERS is the rule.

    common/     config (YAML + --set), devices, the Ray session, text, bundled assets
    datasets/   one image lister per dataset          world/      the synthetic world
    extract/    images -> shards: plan, steps, local and Ray engines, show, shards verbs
    detector/   training the detector                 corpus/     the corpus: build and read
    evaluate/   the benchmarks' official metrics      train/      the shared trainer (Job, loop)
    pretrain/   objectives, data, the pretraining Job  finetune/  tasks, data, Job, predict
    analyze/    what a trained model's attention heads ground (Flickr30K Entities)
    demo/       the demo and the one world set-up     bench/      benchmarks
    cli.py      the table of verbs

A module imports its own package, the libraries, and the packages of lower layers only: never
a package of its own layer (pretrain and finetune know nothing of each other) nor a higher one.
tests/test_architecture.py reads the import graph from the source and holds every module to it.
"""

# pipeline's packages, lowest layer first.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("common",),
    ("datasets", "world"),
    ("extract", "detector", "corpus"),
    ("evaluate", "train"),
    ("pretrain", "finetune"),
    ("analyze",),
    ("demo",),
    ("bench",),
    ("cli",),
)
