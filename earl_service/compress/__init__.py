"""Compress: the most accurate bundle under a byte budget, by successive halving over models, dims and precisions.

Owns what a compress job asks for (`config`, torch-free: the API checks a job with it before queueing) and its
options on the command line, the job form and the worker (`options`, derived from config's fields), the
search's typed state and its one saved form (`state`), the candidates that fit the budget and the time
(`candidates`), one rung's training and validation (`rungs`), the halving and the pick (`search`), its evidence
(`report`) and the worker's compress job (`job`). May import every layer below it: `bundle`, `train`, `data`,
`model`, `service` (the job publishes through the model registry).
"""
