"""The service's shared state, used by the API and the workers alike: the service home (`home`), the job store
(`store`: SQLite by default, Redis for several machines), its records, locks, housekeeping and the model
registry (`registry`, the one way a bundle reaches models/). May import `bundle`; never `api` or `worker`.
"""
