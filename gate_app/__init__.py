"""Kernels through the gate: verdicts, backward walks (lineages) and the jobs that run them."""
