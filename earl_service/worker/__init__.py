"""The job store shared with the API and the worker loop that trains (the API never trains)."""
