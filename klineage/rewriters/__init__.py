"""Rewriters: the sources of candidate simplifications a walk gates (rule catalog, LLM)."""
