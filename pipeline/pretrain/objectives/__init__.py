"""Pretraining objectives, one module per architecture: raw (pair, image) rows -> a masked,
labelled TrainBatch -> named losses and accuracies."""
