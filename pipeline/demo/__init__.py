"""`pipeline demo`: the whole pipeline learning on a laptop, and the world set-up it shares.

world_setup.py   generate a world, extract it with the bundled detector, build its corpus (also
                 used by the benchmarks and the tests)
demo.py          the demo: pretrain a small LXMERT, fine-tune VQA and NLVR2, score, draw
pictures.py      one held-out VQA example's regions and its question's attention over them
"""
