"""Retrieval: the top-K kernel, the never re-extracted gallery, embedding in chunks, compatibility."""
