"""JAX: the MNIST CNN as a Flax linen module, optax SGD, one jitted train step (``workload.py``);
the profiler capture of a ``kernelmap run`` pass (``capture.py``)."""
