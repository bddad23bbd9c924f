"""The package the README's sweep names (``mypkg.data:train_set``), for ``benchmarks/manager_cost.py``."""
