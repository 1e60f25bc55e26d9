"""KLineage engine: problems, kernels, the gate, walks and skills. Importable without Django."""

__version__ = "0.1.0"
