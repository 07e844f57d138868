"""Arena: dynamic scheduling and adaptive-parallelism co-design for large-model training.

One subpackage per pipeline stage (analyze, plan, profile, schedule, run) plus the shared
``models``, ``hardware`` and ``artifacts``. Only analyze, profile and run import JAX.
"""

__version__ = "0.1.0"
