"""The session engine: a run's context, its sessions' phases, the jitted step, population runs.

``runner.run(config, workdir)`` is the whole protocol; ``phases`` are the steps of one session;
``context.RunContext`` is everything fixed for a run; ``run_state.RunState`` what carries between
sessions; ``train_step`` the one jitted step; ``population`` N members trained together.
"""
