"""The run directory, the storage layer: one writer per workdir, checkpoints, logs, the layout, and the
stored gallery rows.  It imports no method, model, config or engine module (``tests/test_layout.py``)."""
