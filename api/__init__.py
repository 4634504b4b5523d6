"""The EARL HTTP service: FastAPI app over the job store and the model registry (the API never trains)."""
