"""Host side: Slurm submission, torchrun launch arguments from the allocation, run status.

May import: the stdlib of Python 3.10 only (the controller's and the nodes' own Python, outside
the training image), plus the top-level config and errors modules, which are stdlib-only too.
"""
