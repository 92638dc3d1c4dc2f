"""`pipeline pretrain`: corpus pairs joined with feature shards, every paper's objectives, trained
by the shared loop (pipeline/train/) on N Ray Train workers.

config.py       PretrainConfig: arch, model, objective, data (+ the trainer's optim and run)
objectives/     one per architecture: rows -> masked, labelled TrainBatch -> named losses
data.py         the training, validation and text-only streams (corpus pairs x shard samples)
job.py          the Job of a pretraining run
command.py      the verb
"""
