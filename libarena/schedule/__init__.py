"""arena-schedule's library: a deterministic cluster simulator, Arena's scheduler and faithful baselines.

Layout (after microsoft/vidur's): ``entities/`` (jobs, allocations, per-type node pools with buddy
allocation), ``events/`` (one class per event on a totally ordered heap), ``policies/`` (one module per
registered policy: arena, fcfs, gavel, elasticflow, elasticflow-ls, sia), ``config`` (typed configuration,
overheads with the paper's values), ``perf`` (perf-table lookup and decision views), ``traces`` (readers and
the seeded adaptation rule), ``simulator``, ``metrics``, ``plots``, ``compare``, ``api`` (entry points), and
``live/`` (``arena-schedule serve``: the same policies against real time, state in SQLite, jobs via arena-run).

Decision view vs execution truth: a policy decides from its view (``arena`` = profiled proxy plans, ``dp`` =
pure data parallel, ``dp-linear`` = Sia's bootstrapped linear estimate, ``ap``), while every job progresses at
the execution truth (the best adaptive plan, ``ap``). Never imports JAX.
"""
