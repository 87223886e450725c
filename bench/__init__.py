"""Benchmarks against the limits the issue sets: `make bench` (or `python -m bench.run`).

* `bench.load`: the load generator (a realistic event mix, published flat out or at a fixed rate).
* `bench.baselines`: the naive consumer and the raw ceiling the journal-writer is compared with.
* `bench.services`: services run as their own processes, with their position and memory watched.
* `bench.latency`: publish -> visible latency at a fixed rate.
* `bench.imports`: `cos import claude` on a copied corpus, against ccusage on the same files.
* `bench.report`: the table and `bench/out/summary.json`.
* `bench.run`: the orchestrator.
"""
