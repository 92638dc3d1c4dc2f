"""`pipeline demo`: the whole pipeline learning on a laptop, and the world set-up it shares.

world_setup.py   generate a world, extract it with the bundled detector, build its corpus (also
                 used by the benchmarks and the tests)
demo.py          the demo: pretrain a small LXMERT, fine-tune VQA and NLVR2, score, draw
recipe.py        the demo's world and model sizes, its LXMERT's pretraining and fine-tuning configs
benchmarks.py    `demo benchmarks`: VCR, RefCOCO+, Flickr30K against their baselines
ablation.py      `demo end-to-end`: the detector frozen or trained with VL-BERT
grounding.py     `demo grounding`: which attention heads ground the captions' entities
trainings.py     training runs side by side
pictures.py      one held-out VQA example's regions and its question's attention over them
"""
