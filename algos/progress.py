"""One progress bar with an ETA per training job, instead of transformers' line per logged
step (its PrinterCallback prints every `logs` dict; its ProgressCallback writes each under
its bar). The bar's postfix shows the latest of a few logged values.

    trainer = SFTTrainer(...)
    step_bar(trainer, "SFT", ("loss",))
"""

from __future__ import annotations

from collections.abc import Sequence


def step_bar(trainer, desc: str, show: Sequence[str] = ("loss",)) -> None:
    """Replace `trainer`'s printing callbacks with one bar over its optimiser steps."""
    from transformers import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(_bar_callback(desc, tuple(show)))


def _bar_callback(desc: str, show: tuple[str, ...]):
    from tqdm.auto import tqdm
    from transformers import TrainerCallback

    class StepBar(TrainerCallback):
        bar = None

        def on_train_begin(self, args, state, control, **kw):
            self.bar = tqdm(total=state.max_steps, desc=desc, unit="step", dynamic_ncols=True)

        def on_step_end(self, args, state, control, **kw):
            if self.bar is not None:
                self.bar.update(state.global_step - self.bar.n)

        def on_log(self, args, state, control, logs=None, **kw):
            picked = {k: f"{v:.3g}" for k, v in (logs or {}).items() if k in show and isinstance(v, (int, float))}
            if self.bar is not None and picked:
                self.bar.set_postfix(picked, refresh=False)

        def on_train_end(self, args, state, control, **kw):
            if self.bar is not None:
                self.bar.close()
                self.bar = None

    return StepBar()
