"""``kernelmap run``: train and time each framework x mode x batch size x pass in its own worker process.

This process imports no framework. Capture passes are separate runs of the same steps, so one pass's
overhead never shows in another's timings (the "leveled" method of arXiv:1908.06869): ``clean`` (no
profiler), ``framework`` (its profiler), ``libs`` (cuDNN/cuBLAS/cuBLASLt logs on the GPU, oneDNN verbose
on the CPU) and ``nsys`` (Nsight Systems, where found). The stages, each a module:

    cli        the command line; ``execute``: validate -> plan -> run_cases -> write_run -> normalise
    devices    where each framework runs (its probe, its GPU verdict) and its workers' environment
    schedule   the interleaved rounds, repeats of contended or disagreeing trials
    case       one case (framework x mode x batch size): its workers, and running the schedule
    processes  one worker process: its process group, stderr tee, failure line; the progress line
    results    each case's results.json entry, the --json summary, the console table

Nothing is imported here: ``kernelmap.cli`` imports ``kernelmap.run.cli`` when ``kernelmap run`` runs.
"""
