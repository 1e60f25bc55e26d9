"""Gate records, mirroring the engine's documents: problems, kernel states (source plus launch
plan, by fingerprint), verdicts, lineages with their transitions and rejections, and the jobs
that run gates and walks on GPU workers. None yet."""
