"""The trainer shared by pretraining and fine-tuning: a plain loop that Ray Train runs on N workers.

config.py       OptimConfig, RunConfig: the optimiser and run sections of every training config
batch.py        TrainBatch and the Objective protocol (rows -> batch -> named losses)
job.py          Job: what the loop trains (model, objective, streams, export), built per worker
loop.py         Trainer and train_loop: steps, DDP, validation, exact resume, logs, checkpoints
step.py         TrainStep: the optimizer, its schedule, a micro-batch's forward and backward, the
                update; capturable (learning rates in device tensors, stats in one tensor)
precision.py    run.precision: float32, autocast, or bf16 weights with float32 master weights
graphs.py       run.cuda_graph: the whole step captured as one CUDA graph and replayed
errors.py       DivergenceError, Stopped (torch-free: the command line names them)
stop.py         SIGTERM / SIGINT while training: finish the step, checkpoint, exit 143 / 130
coordination.py what the driver and the Ray Train workers of a run tell each other
launch.py       run_training: in this process, or on Ray Train workers (lost workers restarted)
gloo.py         gloo across machines: each Ray Train worker bound to its node's Ray address
checkpoint.py   run-directory checkpoints (state + the model in our checkpoint format)
remote.py       a run directory at a URL (s3://...): local working copies, pushed and pulled
logs.py         metrics.jsonl and TensorBoard
plot.py         `pipeline plot`: loss curves as a PNG
convert.py      `pipeline convert`: checkpoints between our, Hugging Face and official formats
"""
