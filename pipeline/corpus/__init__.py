"""`pipeline corpus build`: the pretraining corpus (LXMERT's splits and answer table) from the
official COCO, Visual Genome, VQA v2, GQA and CC3M annotation files; `pipeline corpus vocab`: a
built corpus's own words as a tokenizer.

config.py   CorpusConfig (file paths, sources, minival, answer table size); CorpusError
sources.py  readers of COCO captions, VQA v2, Visual Genome, GQA
cc3m.py     reader of CC3M captions in img2dataset's webdataset output
answers.py  LXMERT answer normalisation, VQA soft scores, AnswerTable (answers.json)
splits.py   train / nominival / minival / vgnococo / cc3m and each image's shard key
build.py    reads, places, counts, writes the corpus directory (its layout is documented there)
stats.py    the statistics table the command prints
pairs.py    Pair: one pretraining example before masking (a sentence and its image)
read.py     the one reader of a built corpus: load_pairs, load_split, load_answers, load_text
vocab.py    a built corpus's words (BERT's splitting) as a BERT tokenizer directory
command.py  the verb
"""
