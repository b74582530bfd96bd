"""Gallery indexes behind one seam: exact top-K in the process, faiss (HNSW, IVF) and Milvus."""
