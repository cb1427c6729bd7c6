"""`orchard tasks synth`: the data-synthesis pipeline of the harness-training paper (section 3.3,
appendix B.1). Agents propose instructions grounded in an assets pool (store.py keeps them in
SQLite, deduplicated), the best and most diverse N are kept (prune), a builder agent makes each
a Harbor task folder in an Orchard sandbox (workshop.py), the task is tested in Orchard/Harbor-v0
(testing.py: the reference passes, doing nothing fails, a separate model attempts it) and a
refiner patches what failed (pipeline.py drives the stage machine). docs/synthesis.md.
"""

from .pipeline import SynthConfig, synthesize
from .report import format_report

__all__ = ["SynthConfig", "format_report", "synthesize"]
