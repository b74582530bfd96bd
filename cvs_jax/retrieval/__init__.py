"""Retrieval: the top-K kernel, embedding in chunks, compatibility, and reading a finished run."""
