"""hpcfl: federated-learning experiments on HPC clusters.

`python -m hpcfl.launch JOB.toml` runs one job; rank 0 is the server, ranks >= 1 host clients.
"""
__version__ = "0.1.0"
