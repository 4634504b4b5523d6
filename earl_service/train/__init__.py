"""Training: the loop (`loop`), sampled mini-batch training (`sampling`), the learning-rate schedule, checkpoints
and the resumable state, data-parallel ranks (`distributed`), evaluation (`evaluate`), pq codebook fine-tuning
(`finetune`), memory accounting and a run's outputs. May import `core`, `config`, `data`, `model`, `bundle`.
"""
