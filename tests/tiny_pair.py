"""A tiny student (with its tokenizer, trained offline on the toy corpus) and a differently
seeded teacher saved beside it: what the OPD/RPR/vLLM training tests start from."""

from __future__ import annotations

from orchard_gym.algos.tiny import build_model, build_tiny_model, toy_corpus


def student_and_teacher(tmp_path_factory, tasks, system: str):
    """(student, teacher, tokenizer, teacher's folder)."""
    student, tok = build_tiny_model(toy_corpus(tasks.values(), system), tmp_path_factory.mktemp("tiny"),
                                    vocab_size=512, hidden_size=32, num_layers=1, intermediate_size=64)
    teacher = build_model(tok, hidden_size=32, num_layers=1, intermediate_size=64, seed=1)
    tpath = tmp_path_factory.mktemp("teacher")
    teacher.save_pretrained(str(tpath))
    tok.save_pretrained(str(tpath))
    return student, teacher, tok, tpath
