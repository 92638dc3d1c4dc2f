"""`pipeline finetune` and `pipeline predict`: VQA v2, GQA and NLVR2.

examples.py reads the tasks' released files into `Example`s; answers.py builds the answer
vocabularies, the soft-score targets and the row mapping of LXMERT's pretrained QA head; config.py
holds `pipeline finetune`'s settings; data.py joins examples with their images' features (the
shards' random-access store) and batches them; objective.py turns batches into losses, metrics and
predictions; job.py builds the model and the Job the shared trainer (pipeline/train/) runs;
run_model.py rebuilds a run for inference; predictor.py answers with it in Python
(`load_predictor`, the public API: __all__); predict.py writes the benchmarks' submission files
through the same predictor; command.py and predict_command.py are the verbs.
"""

from pipeline.finetune.predictor import (
    Answer,
    AnswerPredictor,
    PairPredictor,
    Predictor,
    QuestionAttention,
    RegionChoice,
    RegionPredictor,
    RetrievalPredictor,
    as_sample,
    load_predictor,
)

__all__ = [
    "Answer",
    "AnswerPredictor",
    "PairPredictor",
    "Predictor",
    "QuestionAttention",
    "RegionChoice",
    "RegionPredictor",
    "RetrievalPredictor",
    "as_sample",
    "load_predictor",
]
