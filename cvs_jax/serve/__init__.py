"""A live visual-search server over a run: ``python -m cvs_jax.serve --workdir W`` (``__main__.py``).

``state.py`` the served run (model, rows, index, adds, the switch to a newer session), ``batcher.py``
dynamic batching on one worker thread, ``uploads.py`` uploaded
images, ``app.py`` the routes, ``page.py`` the web page, ``metrics.py`` the Prometheus text.
"""
