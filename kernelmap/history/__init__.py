"""The step benchmarks' history, in pytest-benchmark's storage (``.benchmarks/``):

- ``keys``     what a saved benchmark is: its key (framework x mode x device x batch size), its run
- ``storage``  ``BenchStorage``, the one owner of the layout on disk (``<machine>/NNNN_<tag>.json``):
               lists, reads, numbers and writes runs, never overwriting one
- ``job``      ``kernelmap save-job``: one bench job's per-framework files as ONE numbered run
- ``compare``  ``kernelmap compare``: saved runs paired like with like, thresholds, noise
- ``trend``    every saved benchmark as one table, and one series per key over jobs (the report's trend)

Storages saved before jobs (one file per framework, no job id) still load and compare: a run without a
job id is a job of its own. Import the module you need; this package re-exports nothing.
"""
