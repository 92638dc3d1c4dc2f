"""`pipeline pretrain`: corpus pairs joined with feature shards, every paper's objectives, a plain
training loop that Ray Train runs on N workers."""
