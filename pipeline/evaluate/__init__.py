"""`pipeline evaluate`: the official metrics of VQA v2, GQA, NLVR2, VCR, RefCOCO+ and Flickr30K
retrieval from the released annotation files and a predictions file (the submission format where
a benchmark has one).

inputs.py    EvaluationError; reading JSON / JSON-lines / CSV inputs, each error naming its file
vqa.py       VQA v2 accuracy as the official vqaEval.py computes it (answer normalisation included)
gqa.py       GQA accuracy (binary / open) and consistency as the official eval.py computes them
nlvr2.py     NLVR2 accuracy and consistency as the official nlvr2/eval/metrics.py computes them
vcr.py       VCR Q->A, QA->R and Q->AR as the leaderboard's evaluator computes them
refcoco.py   RefCOCO+ accuracy at IoU >= 0.5 as ViLBERT's and VL-BERT's code computes it; a
             pickle reader that runs no code
flickr30k.py Flickr30K retrieval R@1/5/10, median and mean rank both ways, as SCAN's evaluation.py
             computes them
error_bars.py the binomial standard error of a score, from the evaluation set's size, and the
             paired one of two runs' difference on the same items
command.py   the verb's arguments, the table it prints and the --json file it writes
"""
