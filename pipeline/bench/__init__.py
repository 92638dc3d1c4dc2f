"""`pipeline bench`: what this machine does per second, measured the same way every time.

extract.py        images/s and ms per stage of `pipeline extract`'s own path; --ray: the
                  engine's overhead
peaked.py         random detector weights with a trained detector's confident scores
dispatch.py       host syncs and kernel-launching ops of a call, counted exactly on any device
pretrain.py       pretraining samples/s for 1, 2, ... Ray Train workers
timing.py         the benchmarks' one timer: warm-up apart, alternating rounds
model.py          training samples/s of our model against transformers' (also `python -m
                  pipeline.bench.model`)
model_lxmert.py   the LXMERT pair for model.py: same weights, batch and loss in both
loop.py           model.py --loop: the pretraining loop against the model alone
loop_data.py      the loop's corpus and shards, written in the real formats
end_to_end.py     one training step with the detector trained end to end (VL-BERT)
scale.py          listing, planning, extracting and resuming CC3M downloads at growing sizes
scale_corpus.py   scale.py's LXMERT corpus and data feed at LXMERT's size
process_memory.py this process's memory (VmRSS, VmHWM)
gpu.py            the GPU suite: `python -m pipeline.bench.gpu --out docs/`, first thing on a GPU
command.py        the verb
"""
