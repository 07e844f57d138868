"""Benchmarks (`make bench`): each bench/bench_<stage>.py has run(results_dir) and writes results/<stage>.json."""
