"""Continual-learning methods: their losses, replay, importance and other policies.

``registry`` maps ``config.method`` to a ``base.Method``; ``cvs`` and ``baselines`` define them from
the loss modules (``losses``, ``distillation``, ``regularizers``), the replay memory (``replay``), the
Fisher importance (``fisher``, ``importance_policies``) and the host-side ``policies``, each kind of
which implements a Protocol of ``seams`` and reads the run through its ``PolicyView``.  Adding a method:
``docs/adding-a-method.md``.
"""
