"""The worker: claims queued jobs from the store, trains or compresses them, publishes the bundle (`loop`).

May import every library layer below it (`service`, `train`, `compress`, ...); the API never trains.
"""
