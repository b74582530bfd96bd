"""What a server logs at its first start on a run never served: each session goes through the gate, and a run of
switches for the same reason is one line naming the sessions and the worst BC and NFR among them (it was one line
per session); a kept session keeps its own line, so no refusal hides in a summary."""

import numpy as np

from cvs_jax.retrieval import gate


def results(sessions: int, broken: int) -> dict:
    """Scores of a run: every model loses a little on the older parts, ``broken`` (0-based) loses 50 points."""
    rng = np.random.default_rng(0)
    matrix = [[None] * sessions for _ in range(sessions)]
    for i in range(sessions):
        for j in range(i + 1):
            matrix[i][j] = 0.9 - (0.5 if i == broken and j < i else 0.02 * rng.random() * (i - j))
    return {"compatibility_recall1": matrix, "negative_flip_rate": list(rng.random(sessions - 1) * 0.1)}


def verdicts(res: dict, thresholds: gate.Thresholds) -> list[dict]:
    served, out = 0, []
    for candidate in range(1, len(res["compatibility_recall1"])):
        v = gate.evaluate(res, candidate, served, thresholds)
        served = candidate if v["decision"] == "switched" else served
        out.append(v)
    return out


def test_switches_for_one_reason_are_one_line_and_a_kept_session_its_own():
    vs = verdicts(results(7, broken=3), gate.Thresholds())
    assert [v["decision"] for v in vs] == ["switched", "switched", "kept", "switched", "switched", "switched"]
    got = gate.lines(vs)
    assert len(got) == 3 and got[1] == gate.line(vs[2])
    for text, group in ((got[0], vs[:2]), (got[2], vs[3:])):
        first, last = group[0]["candidate_session"], group[-1]["candidate_session"]
        low = min(group, key=lambda v: v["bc"])
        high = max(group, key=lambda v: v["nfr"])
        assert text.startswith(f"gate: switched sessions {first}-{last} ({len(group)} sessions; ")
        assert "thresholds BC >= -20, NFR <= 25): within the thresholds" in text
        assert f"lowest BC {low['bc']:+.2f} points (session {low['candidate_session']})" in text
        assert f"highest NFR {high['nfr']:.2f} % (session {high['candidate_session']})" in text


def test_a_lone_switch_and_the_gate_off_read_as_before():
    vs = verdicts(results(3, broken=2), gate.Thresholds())
    assert [v["decision"] for v in vs] == ["switched", "kept"]
    assert gate.lines(vs) == [gate.line(vs[0]), gate.line(vs[1])]
    off = verdicts(results(4, broken=2), gate.Thresholds(off=True))
    (text,) = gate.lines(off)
    assert text.startswith("gate: switched sessions 2-4 (3 sessions; thresholds BC >= -20, NFR <= 25, off)")
    assert "off): the gate is off (--gate off)" in text and "lowest BC -" in text
    assert gate.lines([]) == []
