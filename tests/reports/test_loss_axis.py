"""The run page's loss plot: a log axis once a session's loss spans more than 1e3 (a diverged session
would otherwise flatten every curve into a line at 0), a linear one for ordinary runs."""

from __future__ import annotations

import matplotlib.pyplot as plt

from cvs_jax.reports import plots


def _epochs(losses_by_session):
    return [
        {"session": s + 1, "epoch": e + 1, "loss": loss, "L_c": loss, "val_recall1": 0.3}
        for s, losses in enumerate(losses_by_session)
        for e, loss in enumerate(losses)
    ]


def test_a_diverged_session_gets_a_log_axis():
    fig = plots.training_curves(_epochs([[2.8, 2.1, 1.9], [2.8, 4.1e5, 2.1e20]]))
    assert fig.axes[0].get_yscale() == "log" and "log" in fig.axes[0].get_ylabel()
    plt.close(fig)


def test_ordinary_losses_keep_a_linear_axis():
    # the demo's cvs run: session 1 starts at 2.4, later sessions near 2-3 (a range far below 1e3)
    fig = plots.training_curves(_epochs([[2.43, 1.2, 0.8], [3.27, 1.1, 0.05], [2.32, 1.0, 0.9]]))
    assert fig.axes[0].get_yscale() == "linear"
    plt.close(fig)


def test_the_range_rule_at_its_edge():
    for values, scale in (([1.0, 999.0], "linear"), ([1.0, 1001.0], "log"), ([0.0, -1.0, 5.0, None], "linear")):
        fig, ax = plt.subplots()
        plots.loss_axis(ax, values)
        assert ax.get_yscale() == scale, values
        plt.close(fig)
