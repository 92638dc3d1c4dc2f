"""`pipeline finetune` and `pipeline predict`: VQA v2, GQA and NLVR2.

examples.py reads the tasks' released files into `Example`s; answers.py builds the answer
vocabularies, the soft-score targets and the row mapping of LXMERT's pretrained QA head; config.py
holds `pipeline finetune`'s settings; data.py joins examples with their images' features (the
shards' random-access store) and batches them; objective.py turns batches into losses, metrics and
predictions; job.py builds the model and the Job the shared trainer (pipeline/train/) runs;
predict.py writes the benchmarks' submission files; command.py and predict_command.py are the verbs.
"""
