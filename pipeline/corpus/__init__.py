"""`pipeline corpus build`: the pretraining corpus (LXMERT's splits and answer table) from the
official COCO, Visual Genome, VQA v2, GQA and CC3M annotation files.

config.py   CorpusConfig (file paths, sources, minival, answer table size)
sources.py  readers of COCO captions, VQA v2, Visual Genome, GQA; CorpusError
cc3m.py     reader of CC3M captions in img2dataset's webdataset output
answers.py  LXMERT answer normalisation, VQA soft scores, AnswerTable (answers.json)
splits.py   train / nominival / minival / vgnococo / cc3m and each image's shard key
build.py    reads, places, counts, writes the corpus directory (its layout is documented there)
stats.py    the statistics table the command prints
load.py     reading a built corpus: load_split, load_answers, load_text, record_pairs
"""
