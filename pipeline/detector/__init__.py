"""`pipeline detector train`: the bottom-up-attention detector trained on Visual Genome-format data.

train.py        config, Visual Genome ground truth, aspect-grouped batches, the optimiser loop
evaluation.py   mAP@0.5 and attribute accuracy through the real extraction path
command.py      the verb
The bundled world detector it made lives in pipeline/assets/ (pipeline.common.assets).
"""
