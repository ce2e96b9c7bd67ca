"""What a finished replay comes to, above the replay that made it and the analysis and
report that judge it: the CLI's ``replay``, the nightly job and the notebook call it.

- :mod:`.verdict`: its console summary, its correctness and arm verdicts, its report and
  its exit status (:func:`judge`).
"""

from sessiongen.outcome.verdict import Say, Verdict, arm_check, correctness, judge, quiet, summarize

__all__ = ["Say", "Verdict", "arm_check", "correctness", "judge", "quiet", "summarize"]
