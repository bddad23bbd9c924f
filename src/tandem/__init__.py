"""tandem: train more deep-learning models on fewer resources on one server.

- ``tandem.share``: one producer loads and preprocesses a dataset once and feeds many
  training processes through shared memory.
"""

__version__ = "0.1.0"
