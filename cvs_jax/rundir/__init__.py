"""The run directory: one writer per workdir, its stored config, checkpoints, logs and layout."""
