"""Single-turn on-policy distillation through TRL's own DistillationTrainer (beta=1: reverse
KL), with two tiny offline models sharing one tokenizer: real generation, real TRL steps."""

from __future__ import annotations

import copy
import math

import pytest

from conftest import require_module

torch = require_module("train", "torch")
trl = require_module("train", "trl")
require_module("train", "datasets")

from orchard_gym.algos.distill import distill_single_turn  # noqa: E402
from orchard_gym.algos.opd import TeacherError  # noqa: E402
from orchard_gym.algos.tiny import build_model, build_tokenizer  # noqa: E402

torch.set_num_threads(1)
PROMPTS = ["Create a file named lark.txt with plum.", "Print the secret word.", "List the files here.",
           "Write hello into notes.txt."]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tok = build_tokenizer(PROMPTS * 4, vocab_size=300)
    student = build_model(tok, hidden_size=32, num_layers=1, intermediate_size=64, seed=0)
    teacher = build_model(tok, hidden_size=32, num_layers=1, intermediate_size=64, seed=1)
    path = tmp_path_factory.mktemp("teacher")
    teacher.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return student, teacher, tok, path


def reverse_kl(student, teacher, tok) -> float:
    """Exact KL(pi_S || pi_T) of the next-token distributions, mean over every prompt position."""
    total, n = 0.0, 0
    with torch.no_grad():
        for p in PROMPTS:
            ids = torch.tensor([tok.encode(p)])
            ls = torch.log_softmax(student(ids).logits[0].double(), -1)
            lt = torch.log_softmax(teacher(ids).logits[0].double(), -1)
            total += float((ls.exp() * (ls - lt)).sum())
            n += ids.shape[1]
    return total / n


def test_two_real_steps_lower_the_reverse_kl(pair, tmp_path):
    student, teacher, tok, teacher_path = pair
    student = copy.deepcopy(student)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    kl0 = reverse_kl(student, teacher, tok)
    trainer = distill_single_turn(student, str(teacher_path), tok, PROMPTS, output_dir=tmp_path, max_steps=2,
                                  batch_size=4, learning_rate=1e-2, max_completion_length=8)
    assert type(trainer) is trl.DistillationTrainer and trainer.args.beta == 1.0  # TRL's class, reverse KL
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(v) and v > 0 for v in losses), trainer.state.log_history
    assert any(not torch.equal(before[k], v) for k, v in student.state_dict().items())
    kl1 = reverse_kl(student, trainer.teacher_model, tok)
    assert kl1 < kl0, (kl0, kl1)


def test_tokenizer_mismatch_is_refused(pair, tmp_path):
    student, teacher, tok, _ = pair
    other = build_tokenizer(["completely different words only"] * 5, vocab_size=300)
    with pytest.raises(TeacherError, match="tokenizer differs"):
        distill_single_turn(student, teacher, tok, PROMPTS, output_dir=tmp_path, teacher_tokenizer=other)
    with pytest.raises(TeacherError, match="cannot load the teacher"):
        distill_single_turn(student, str(tmp_path / "nope"), tok, PROMPTS, output_dir=tmp_path)


@pytest.mark.parametrize("prompts, kw", [
    ([], {}), ("one string", {}), ([""], {}), ([3], {}), ([[{"role": "user"}]], {}),
    (["a", [{"role": "user", "content": "b"}]], {}), (["a"], {"beta": 1.5}),
])
def test_garbage(pair, tmp_path, prompts, kw):
    student, teacher, tok, _ = pair
    with pytest.raises(ValueError):
        distill_single_turn(student, teacher, tok, prompts, output_dir=tmp_path, **kw)
