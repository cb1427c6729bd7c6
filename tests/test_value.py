"""Trajectory pool, value model, best-of-N reranking, credit-assignment SFT and `orchard train sft`.

Real pieces: Orchard/Toy-v0 episodes in local sandboxes, run by `orchard eval` with a
scripted OpenAI-compatible model server as the policy (two "checkpoints": one that
mostly solves `write` tasks, one that mostly lists files instead), a tiny Qwen2 built
offline as the value backbone and SFT model, real TRL SFTTrainer steps, and a scripted
judge endpoint (malformed answers, timeouts, out-of-range values)."""

from __future__ import annotations

import json
import random
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from conftest import needs_bwrap, require_module

torch = require_module("train", "torch")
require_module("train", "trl")

from orchard_gym.algos import credit, trajectory_pool as P, rerank, sft, value  # noqa: E402
from orchard_gym.algos.pool_tokens import EntryTokenizer, _plain_args  # noqa: E402
from orchard_gym.algos.tiny import build_tiny_model, toy_corpus  # noqa: E402
from orchard_gym.cli import main  # noqa: E402
from orchard_gym.envs.toy.env import make_tasks  # noqa: E402

torch.set_num_threads(1)
ENV_KW = {"kinds": ["write"], "num_tasks": 16, "variety": 4}
TASKS = make_tasks(**ENV_KW)


# ------------------------------------------------------------------ scripted model server
class Scripted(BaseHTTPRequestHandler):
    """`policy-P`: solves a write task with probability P (else `ls`), then submits.
    `judge-*`: a judge that answers well, malformed, out of range, slowly or with a 500."""

    rng = random.Random(0)
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def _send(self, status: int, body: dict):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        model, messages = body["model"], body["messages"]
        if model.startswith("policy-"):
            if any(m["role"] == "assistant" for m in messages):
                call = {"name": "submit", "arguments": "{}"}
            else:
                m = re.search(r"named (\S+) that contains the word (\w+)", messages[-1]["content"])
                with self.lock:
                    good = self.rng.random() < float(model.split("-")[1])
                command = f"echo {m.group(2)} > {m.group(1)}" if good else "ls"
                call = {"name": "bash", "arguments": json.dumps({"command": command})}
            message = {"role": "assistant", "content": None,
                       "tool_calls": [{"id": "c1", "type": "function", "function": call}]}
            return self._send(200, {"choices": [{"message": message, "finish_reason": "tool_calls"}]})
        n = int(re.search(r"Trajectory \((\d+) actions\)", messages[0]["content"]).group(1))
        answers = {"judge-good": json.dumps({"values": [{"step": 0, "p": 0.1}, {"step": 1, "p": 0.4},
                                                        {"step": n, "p": 0.0}]}),
                   "judge-fenced": "Here:\n```json\n" + json.dumps({"values": [{"step": 0, "p": 0.2},
                                                                             {"step": n, "p": 0.2}]}) + "\n```",
                   "judge-malformed": "The agent did fine, maybe 0.4 at step 1.",
                   "judge-range": json.dumps({"values": [{"step": 0, "p": 1.5}]}),
                   "judge-step": json.dumps({"values": [{"step": n + 3, "p": 0.5}]}),
                   "judge-nan": '{"values": [{"step": 0, "p": NaN}]}'}
        if model == "judge-slow":
            time.sleep(2.0)
        if model == "judge-500":
            return self._send(500, {"error": {"message": "boom"}})
        self._send(200, {"choices": [{"message": {"role": "assistant", "content": answers.get(model, "")}}]})


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    thread.join(5)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    build_tiny_model(toy_corpus(TASKS.values()) + ["ls", "lark.txt\n", "(no output)"], path, vocab_size=400,
                     hidden_size=48, num_layers=2, intermediate_size=96)
    return path


def run_eval(server, out, policy, task_ids, k=1, extra=()):
    args = ["eval", "--env", "Orchard/Toy-v0", "--env-kwargs", json.dumps(ENV_KW),
            "--policy", f"openai:{server}#{policy}",
            "--max-steps", "3", "--concurrency", "6", "-k", str(k), "--out", str(out), *extra]
    for t in task_ids:
        args += ["--task-id", t]
    return CliRunner().invoke(main, args, catch_exceptions=False)


@pytest.fixture(scope="module")
def episodes(server, tmp_path_factory, local_root_module):
    """Two checkpoints on 12 training tasks (2 episodes each); the held-out 4 tasks are left."""
    d = tmp_path_factory.mktemp("runs")
    out = {}
    for policy in ("policy-0.85", "policy-0.15"):
        r = run_eval(server, d / f"{policy}.jsonl", policy, sorted(TASKS)[:12], k=2)
        assert r.exit_code == 0, r.output
        out[policy] = d / f"{policy}.jsonl"
    return out


@pytest.fixture(scope="module")
def local_root_module(tmp_path_factory):
    import os
    import shutil
    from pathlib import Path

    root = Path(f"/tmp/og-value-{os.getpid()}")  # short: unix socket paths are limited to 108 bytes
    root.mkdir(exist_ok=True)
    old = os.environ.get("ORCHARD_LOCAL_ROOT")
    os.environ["ORCHARD_LOCAL_ROOT"] = str(root)
    yield root
    if old is None:
        os.environ.pop("ORCHARD_LOCAL_ROOT", None)
    else:
        os.environ["ORCHARD_LOCAL_ROOT"] = old
    shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------------------ the maths, by hand
def test_gae_targets_hand_computed():
    g, lam = 0.98, 0.95
    gl = g * lam  # 0.931
    assert value.gae_targets([0, 0, 1.0]) == pytest.approx([gl ** 2, gl, 1.0])  # 0.866761, 0.931, 1
    assert value.gae_targets([0, 0, -1.0]) == pytest.approx([-0.866761, -0.931, -1.0])
    # with bootstrap values V = [0.5, 0.2, 0.1]: delta = [-0.304, -0.102, 0.9]
    # A_2 = 0.9; A_1 = -0.102 + 0.931 * 0.9 = 0.7359; A_0 = -0.304 + 0.931 * 0.7359 = 0.3811229
    assert value.gae_targets([0, 0, 1.0], [0.5, 0.2, 0.1]) == pytest.approx([0.8811229, 0.9359, 1.0])
    assert value.gae_targets([1.0]) == [1.0]
    assert value.gae_targets([0, 1.0], gamma=0.5, lam=1.0) == pytest.approx([0.5, 1.0])
    with pytest.raises(ValueError):
        value.gae_targets([0, 1], [0.0])
    with pytest.raises(ValueError):
        value.gae_targets([1], gamma=1.5)


def test_rise_segments_hand_computed():
    curve = [0.1, 0.2, 0.25, 0.25, 0.6, 0.5, 0.55, 0.6]
    c = credit.credits(curve)
    assert c == pytest.approx([0.1, 0.05, 0.0, 0.35, -0.1, 0.05, 0.05])
    # 0.25 - 0.2 is 0.04999999999999999 in floats: a tie at eps, so a rise
    assert credit.rise_segments(c, 0.05) == [(0, 2), (3, 4), (5, 7)]
    assert credit.rise_segments(c, 0.06) == [(0, 1), (3, 4)]
    assert credit.rise_segments(credit.credits([0.3] * 6), 0.05) == []  # flat: nothing rises
    assert credit.rise_segments(credit.credits([0.3] * 6), 0.0) == [(0, 5)]  # eps 0: a tie everywhere
    assert credit.rise_segments([], 0.05) == []
    assert credit.interpolate({0: 0.1, 4: 0.5, 6: 0.0}, 8) == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.25, 0.0, 0.0])
    assert credit.interpolate({2: 0.3}, 4) == [0.3] * 4


def test_rerank_table_hand_computed():
    def e(task, ok):
        return P.PoolEntry(entry_id=f"{task}{ok}{random.random()}", policy_id="p", env_id="x", task_id=task,
                           reward=float(ok), resolved=ok, messages=[], turns=1)

    groups = {"a": [e("a", False), e("a", True)], "b": [e("b", True), e("b", True)], "c": [e("c", False)] * 2,
              "d": [e("d", True), e("d", False), e("d", False), e("d", False)]}
    scores = {"a": [0.1, 0.9], "b": [0.0, 0.0], "c": [1.0, 2.0], "d": [0.0, 0.5, 0.1, 0.2]}
    t = rerank.compare(groups, scores)
    assert t["value"] == 0.5 and t["first"] == 0.5 and t["oracle"] == 0.75
    assert t["random"] == pytest.approx((0.5 + 1 + 0 + 0.25) / 4)
    assert t["mixed_tasks"] == 2 and t["selection_accuracy"] == 0.5
    assert t["selection_accuracy_random"] == pytest.approx((0.5 + 0.25) / 2)
    assert rerank.score([0.1, 0.7, 0.2], "final") == 0.7 and rerank.score([0.1, 0.7, 0.2], "end") == 0.2
    assert rerank.score([0.1, 0.7, 0.2], "mean") == pytest.approx(0.4)
    with pytest.raises(ValueError, match="aggregation"):
        rerank.score([0.1], "median")


# ------------------------------------------------------------------ the judge
def _unresolved_entry():
    msgs = [{"role": "user", "content": "Create a file."}]
    for i in range(3):
        msgs += [{"role": "assistant", "content": f"```bash\nls {i}\n```"}, {"role": "user", "content": "x"}]
    return P.PoolEntry(entry_id="u1", policy_id="p", env_id="x", task_id="t", reward=0.0, resolved=False,
                       messages=msgs, turns=3)


def test_judge_stub_failures_drop_the_trajectory(server, tiny, tmp_path):
    entry = _unresolved_entry()
    # a local model as the judge: the random tiny model writes no JSON, so the trajectory is dropped
    local = credit.LocalJudge(tiny, max_new_tokens=6)
    assert "Trajectory (3 actions)" in local.prompt(entry) and "not resolved" in local.prompt(entry)
    kept, dropped = credit.annotate([entry, _entry(True, ["ls"])], local)
    assert [e.resolved for e, _ in kept] == [True] and sum(dropped.values()) == 1
    good = credit.OpenAIJudge(f"{server}#judge-good", timeout=5)
    assert good(entry) == pytest.approx([0.1, 0.4, 0.2, 0.0])  # keys 0, 1, 3; step 2 interpolated
    assert credit.OpenAIJudge(f"{server}#judge-fenced", timeout=5)(entry) == [0.2] * 4
    for model, why in (("judge-malformed", "no JSON"), ("judge-range", "not in [0, 1]"),
                       ("judge-step", "not an integer in"), ("judge-nan", "not in [0, 1]"),
                       ("judge-slow", "did not answer"), ("judge-500", "HTTP 500"), ("judge-empty", "empty")):
        judge = credit.OpenAIJudge(f"{server}#{model}", timeout=0.5)
        with pytest.raises(credit.JudgeError, match=re.escape(why)):
            judge(entry)
        kept, dropped = credit.annotate([entry], judge)
        assert kept == [] and sum(dropped.values()) == 1
    with pytest.raises(credit.JudgeError):
        credit.OpenAIJudge("http://127.0.0.1:9/v1#m", timeout=0.5)(entry)  # nobody listens: dropped too
    bad_prompt = tmp_path / "p.md"
    bad_prompt.write_text("no fields here")
    with pytest.raises(ValueError, match="lacks the field"):
        credit.OpenAIJudge(f"{server}#judge-good", bad_prompt)
    with pytest.raises(ValueError, match="URL#MODEL"):
        credit.OpenAIJudge(server)
    for garbage in ("", "[]", '{"values": 3}', '{"values": [{"step": true, "p": 0.1}]}',
                    '{"values": [{"step": 0, "p": 0.1}, {"step": 0, "p": 0.2}]}'):
        with pytest.raises(credit.JudgeError):
            credit.parse_judgement(garbage, 3)


# ------------------------------------------------------------------ pool, value, rerank, SFT on real episodes
@needs_bwrap
def test_pool_value_rerank_and_online_best_of(episodes, server, tiny, tmp_path):
    pool_file = tmp_path / "pool.jsonl"
    for policy, path in episodes.items():
        r = CliRunner().invoke(main, ["pool", "add", str(path), "--pool", str(pool_file), "--policy-id", policy,
                                      "--env", "Orchard/Toy-v0", "--env-kwargs", json.dumps(ENV_KW)])
        assert r.exit_code == 0, r.output
    entries = P.read_pool(pool_file)
    assert len(entries) == 48 and {e.policy_id for e in entries} == set(episodes)
    good = [e for e in entries if e.resolved]
    bad = [e for e in entries if not e.resolved]
    assert good and bad and all("echo" in json.dumps(e.messages[2]) for e in good)
    by_policy = {p: sum(e.resolved for e in entries if e.policy_id == p) for p in episodes}
    assert by_policy["policy-0.85"] > by_policy["policy-0.15"]  # the two checkpoints differ detectably
    e0 = entries[0]
    assert e0.messages[1]["content"].endswith("Then call submit.") and e0.tool_names == ["bash", "submit"]

    # tokens: the rendered conversation is exactly the chat template's, masks on the assistant turns
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny))
    tokens = EntryTokenizer(tok)(e0)
    want = tok.apply_chat_template([_plain_args(m) for m in e0.messages[:-1]], tokenize=False)
    assert tok.decode(tokens.ids) + "\n" == want and len(tokens.spans) == e0.turns == 2
    for a, b in tokens.spans:
        assert tok.decode(tokens.ids[b - 1]) == "<|im_end|>" and "<tool_call>" in tok.decode(tokens.ids[a:b])
        assert tok.decode(tokens.ids[:a]).endswith("<|im_start|>assistant\n")

    # value model on the tiny backbone, split by task; held-out tasks: none of the training tasks
    vdir = tmp_path / "value"
    r = CliRunner().invoke(main, ["value", "train", "--pool", str(pool_file), "--model", str(tiny), "--out",
                                  str(vdir), "--epochs", "8", "--lr", "5e-3", "--batch-size", "4",
                                  "--val-fraction", "0.25"])
    assert r.exit_code == 0, r.output
    summary = json.loads((vdir / "value_train.json").read_text())
    assert summary["val_tasks"] == 3 and summary["history"][-1]["train_mse"] < summary["history"][0]["train_mse"]
    vm = value.ValueModel.load(vdir)
    held_out = set(vm.config["val_tasks"])
    train_part, val_part = P.split_by_task(entries, 0.25, 0)  # what train_value did with these arguments
    assert held_out == {e.task_id for e in val_part} and not held_out & {e.task_id for e in train_part}
    scores = [rerank.score(vm.state_values(e)) for e in entries if e.task_id in held_out]
    labels = [e.resolved for e in entries if e.task_id in held_out]
    good_scores = [s for s, y in zip(scores, labels, strict=True) if y]
    bad_scores = [s for s, y in zip(scores, labels, strict=True) if not y]
    assert good_scores and bad_scores and sum(good_scores) / len(good_scores) > sum(bad_scores) / len(bad_scores)

    # offline rerank of held-out candidates
    r = CliRunner().invoke(main, ["value", "rerank", "--value", str(vdir), "--pool", str(pool_file),
                                  "--out", str(tmp_path / "picks.jsonl")])
    assert r.exit_code == 0, r.output
    table = json.loads(r.output.strip().splitlines()[-2])
    assert table["tasks"] == 3 and table["oracle"] >= table["value"] > table["random"]

    # online: a third policy on the 4 tasks no one trained on, best-of-4 with the value model
    fresh = sorted(TASKS)[12:]
    out = tmp_path / "online.jsonl"
    r = run_eval(server, out, "policy-0.5", fresh, extra=["--best-of", "4", "--value", str(vdir)])
    assert r.exit_code == 0, r.output
    candidates = [json.loads(x) for x in out.read_text().splitlines()]
    picks = [json.loads(x) for x in out.with_suffix(".best-of.jsonl").read_text().splitlines()]
    assert len(candidates) == 16 and len(picks) == 4 and "best-of-4: 4 picks of 16 candidates" in r.output
    # the ledger is the run's cost: every candidate's sandbox, not the picks' alone
    assert int(re.search(r"^ledger: (\d+) sandboxes", r.output, re.M)[1]) >= 16, r.output
    for p in picks:
        b = p["metadata"]["best_of"]
        assert b["n"] == 4 and len(b["scores"]) == 4 and (p["reward"] > 0) <= any(b["resolved"])
    assert sum(p["reward"] for p in picks) > sum(c["reward"] for c in candidates) / 4  # beats random's expectation
    bad = CliRunner().invoke(main, ["eval", "--env", "Orchard/Toy-v0", "--best-of", "2"])
    assert bad.exit_code != 0 and "--value" in bad.output


# ------------------------------------------------------------------ SFT masks, every mode
def _texts(tok, ex):
    """The runs of loss tokens of an example, decoded."""
    runs, cur = [], []
    for i, m in zip(ex.input_ids, ex.loss_mask, strict=True):
        if m:
            cur.append(i)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    if cur:
        runs.append(tok.decode(cur))
    return runs


def _entry(resolved: bool, commands: list[str]) -> P.PoolEntry:
    msgs = [{"role": "system", "content": "Act."}, {"role": "user", "content": "Create lark.txt with plum."}]
    for i, c in enumerate(commands):
        msgs += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": "bash",
                                                                  "arguments": json.dumps({"command": c})}}]},
                 {"role": "tool", "tool_call_id": f"call_{i}", "content": f"out {i}"}]
    return P.PoolEntry(entry_id=f"e-{resolved}-{len(commands)}", policy_id="p", env_id="Orchard/Toy-v0",
                       task_id="write-000", reward=float(resolved), resolved=resolved, messages=msgs,
                       turns=len(commands), tool_names=["bash", "submit"])


def test_sft_masks_token_by_token_in_every_mode(tiny):
    from transformers import AutoTokenizer

    from orchard_gym.wrappers.proxy.records import CallRecord, RolloutRecord

    tok = AutoTokenizer.from_pretrained(str(tiny))
    tk = EntryTokenizer(tok)
    cmds = ["ls", "cat a", "echo plum > lark.txt", "ls -l"]
    call = [f'<tool_call>\n{{"name": "bash", "arguments": {{"command": "{c}"}}}}\n</tool_call><|im_end|>'
            for c in cmds]
    unresolved, resolved = _entry(False, cmds), _entry(True, cmds[:2])
    full = sft.build_examples([unresolved], tk, "full")
    assert len(full) == 1 and _texts(tok, full[0]) == call
    assert tok.decode(full[0].input_ids) == tok.apply_chat_template(
        [_plain_args(m) for m in unresolved.messages[:-1]], tokenize=False).rstrip("\n")
    per_turn = sft.build_examples([unresolved], tk, "per-turn")
    assert [_texts(tok, x) for x in per_turn] == [[c] for c in call]
    for t, x in enumerate(per_turn):  # context: everything before the turn; the example ends with it
        assert tok.decode(x.input_ids).endswith(call[t])
        assert sum(x.loss_mask) == len(tok(call[t][:-len("<|im_end|>")])["input_ids"]) + 1
        assert x.input_ids == full[0].input_ids[:len(x.input_ids)]
    # rise: curve 0.1 0.1 0.3 0.35 0.0 -> credits 0, 0.2, 0.05 (a tie), -0.35 -> actions 1 and 2 train
    curves = {unresolved.entry_id: [0.1, 0.1, 0.3, 0.35, 0.0], resolved.entry_id: None}
    rise = sft.build_examples([unresolved, resolved], tk, "rise", curves=curves)
    assert _texts(tok, rise[0]) == call[1:3] and tok.decode(rise[0].input_ids).endswith(call[2])
    assert "ls" in tok.decode(rise[0].input_ids)  # the earlier history stays, as context
    assert _texts(tok, rise[1]) == call[:2]  # resolved: every action
    flat = sft.build_examples([unresolved], tk, "rise", curves={unresolved.entry_id: [0.2] * 5})
    assert flat == []
    with pytest.raises(ValueError, match="annotate"):
        sft.build_examples([unresolved], tk, "rise")
    # calls: one example per recorded call, loss on its response only
    calls = [CallRecord(index=i, call_id=f"c{i}", request={}, messages=[{"role": "user", "content": f"q{i}"}],
                        message={"role": "assistant", "content": f"answer {i}"}) for i in range(2)]
    record = RolloutRecord(rollout_id="r", status="finished", reward=1.0, calls=calls)
    entry = P.from_rollout(record, policy_id="claw")
    ex = sft.build_examples([entry], tk, "calls")
    assert [_texts(tok, x) for x in ex] == [["answer 0<|im_end|>"], ["answer 1<|im_end|>"]]
    assert tok.decode(ex[1].input_ids).endswith(
        "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\nanswer 1<|im_end|>")
    with pytest.raises(ValueError, match="proxy"):
        sft.build_examples([unresolved], tk, "calls")
    with pytest.raises(ValueError, match="mode"):
        sft.build_examples([unresolved], tk, "everything")


def test_credit_sft_trains_only_the_intended_tokens(tiny, tmp_path):
    """Real TRL steps: TRL's labels are the input ids exactly on the rise tokens (-100 elsewhere),
    its loss is the cross-entropy over those tokens only, and a step changes the model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny))
    model = AutoModelForCausalLM.from_pretrained(str(tiny))
    unresolved, resolved = _entry(False, ["ls", "cat a", "echo plum > lark.txt", "ls -l"]), _entry(True, ["ls"])

    class CurveJudge:  # the value-model judge's interface; this curve rises on actions 1 and 2
        def __call__(self, e):
            return [0.1, 0.1, 0.3, 0.35, 0.0]

    annotated, dropped = credit.annotate([unresolved, resolved], CurveJudge())
    assert not dropped and [c for _, c in annotated] == [[0.1, 0.1, 0.3, 0.35, 0.0], None]
    examples = sft.build_examples([e for e, _ in annotated], EntryTokenizer(tok), "rise",
                                  curves={e.entry_id: c for e, c in annotated})
    trainer = sft.make_trainer(model, tok, examples, steps=2, output_dir=tmp_path, learning_rate=1e-2, batch_size=2)
    rows = list(trainer.train_dataset)
    for ex, row in zip(examples, rows, strict=True):
        assert row["input_ids"] == ex.input_ids
        assert row["labels"] == [i if m else -100 for i, m in zip(ex.input_ids, ex.loss_mask, strict=True)]
    batch = trainer.data_collator(rows)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")).logits
        got = float(trainer.compute_loss(model, dict(batch)))
    labels = batch["labels"][:, 1:]
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                           ignore_index=-100, reduction="sum")
    assert got == pytest.approx(float(ce) / int((labels != -100).sum()), rel=1e-4)
    assert int((labels != -100).sum()) == sum(sum(x.loss_mask) for x in examples)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


# ------------------------------------------------------------------ CLI end to end and garbage
@needs_bwrap
def test_cli_sft_rise_with_the_value_model_as_judge_and_garbage(episodes, tiny, tmp_path):
    pool_file = tmp_path / "pool.jsonl"
    r = CliRunner().invoke(main, ["pool", "add", *map(str, episodes.values()), "--pool", str(pool_file),
                                  "--policy-id", "mixed", "--env", "Orchard/Toy-v0", "--env-kwargs",
                                  json.dumps(ENV_KW), "--cap-per-task", "1", "--balance", "1"])
    assert r.exit_code == 0, r.output
    entries = P.read_pool(pool_file)
    assert len({e.task_id for e in entries}) == len(entries)  # one per task
    assert sum(e.resolved for e in entries) == len(entries) - sum(e.resolved for e in entries)  # balanced
    vdir = tmp_path / "v"
    assert CliRunner().invoke(main, ["value", "train", "--pool", str(pool_file), "--model", str(tiny), "--out",
                                     str(vdir), "--epochs", "2", "--bootstrap"]).exit_code == 0
    r = CliRunner().invoke(main, ["train", "sft", "--pool", str(pool_file), "--model", str(tiny), "--mode", "rise",
                                  "--judge-value", str(vdir), "--eps", "0.0", "--steps", "1", "--batch-size", "2",
                                  "--select", "diverse-repo", "-n", "6", "--out", str(tmp_path / "sft")])
    assert r.exit_code == 0, r.output
    assert "judge:" in r.output and (tmp_path / "sft" / "final" / "config.json").exists()

    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text('{"env_id": "x"}\n')
    for args, why in (
        (["pool", "add", str(garbage), "--pool", str(pool_file), "--policy-id", "p"], "garbage.jsonl:1"),
        (["pool", "add", str(episodes["policy-0.85"]), "--pool", str(pool_file), "--policy-id", "p"], "--env"),
        (["pool", "add", str(garbage), "--pool", str(pool_file), "--policy-id", "p", "--env", "No/Such-v0"], "No/Such"),
        (["pool", "add", str(garbage), "--pool", str(pool_file), "--policy-id", "p", "--env-kwargs", "[", "--env",
          "Orchard/Toy-v0"], "not JSON"),
        (["value", "train", "--pool", str(garbage), "--model", str(tiny), "--out", str(tmp_path / "x")], "garbage"),
        (["value", "rerank", "--value", str(tiny), "--pool", str(pool_file)], "no value model"),
        (["train", "sft", "--pool", str(pool_file), "--model", str(tiny), "--mode", "rise"], "exactly one"),
        (["train", "sft", "--pool", str(pool_file), "--model", str(tiny), "--mode", "calls"], "proxy"),
        (["eval", "--env", "Orchard/Toy-v0", "--env-kwargs", "[1]"], "not a JSON object"),
        (["eval", "--env", "Orchard/Toy-v0", "--env-kwargs", "{"], "not a JSON object"),
    ):
        r = CliRunner().invoke(main, args)
        assert r.exit_code != 0 and why in r.output, (args, r.output)
    assert len(P.read_pool(pool_file)) == len(entries)  # nothing lost, nothing half-written
    with pytest.raises(ValueError):
        sft.select(entries, 3, "biggest")
    files = [P.PoolEntry(**{**entries[0].model_dump(), "entry_id": str(i), "metadata": {"gold_files": i,
                                                                                        "gold_lines": 10 - i}})
             for i in range(4)]
    assert [e.metadata["gold_files"] for e in sft.select(files, 2, "multi-file")] == [3, 2]
    assert [e.metadata["gold_lines"] for e in sft.select(files, 2, "large-diff")] == [10, 9]
    assert {e.entry_id for e in sft.select(files, 4, "composite")} == {"0", "1", "2", "3"}
    assert len(sft.select(files, 2, "random", seed=1)) == 2 and len(sft.select(files, 9, "random")) == 4


# ------------------------------------------------------------------ pool sources and filters
def _trajectory(task_id, actions, errors, reward=0.0, error=None):
    from orchard_gym.trajectory import Trajectory, Turn

    turns = [Turn(index=i, action=a, error=e, observation=f"Error: {e}" if e else "ok")
             for i, (a, e) in enumerate(zip(actions, errors, strict=True))]
    return Trajectory(env_id="Orchard/Toy-v0", task_id=task_id, turns=turns, reward=reward, terminated=True,
                      error=error)


def test_pool_filters_caps_balance_and_proxy_calls(tiny, tmp_path):
    from transformers import AutoTokenizer

    from orchard_gym.wrappers.proxy.records import CallRecord, RolloutRecord

    info = P.TaskInfo("Orchard/Toy-v0", ENV_KW)
    bash = {"name": "bash", "arguments": {"command": "ls"}}
    trajs = [
        _trajectory("write-000", [bash, {"name": "submit", "arguments": {}}], [None, None], reward=1.0),
        _trajectory("write-000", [bash, {"name": "submit", "arguments": {}}], [None, None], reward=1.0),
        _trajectory("write-001", [{"name": "python", "arguments": {}}, bash], ["unknown tool 'python'", None]),
        _trajectory("write-002", ["I think I should look around", bash], ["no action found.", None]),
        _trajectory("write-003", [bash], [None]),
        _trajectory("write-004", [bash], [None], error="SandboxFailed: gone"),  # infrastructure: never pooled
    ]
    run = tmp_path / "eval.jsonl"
    run.write_text("".join(t.model_dump_json() + "\n" for t in trajs))
    entries, skipped = P.from_file(run, policy_id="p", info=info)
    assert skipped == 1 and len(entries) == 5 and len({e.entry_id for e in entries}) == 5
    kept, dropped = P.filter_entries(entries)
    assert dropped == {"undefined-tool": 1, "unparsable": 1} and {e.task_id for e in kept} == {"write-000",
                                                                                              "write-003"}
    kept2, dropped2 = P.filter_entries(entries, drop_unparsable=False, drop_undefined_tools=False)
    assert len(kept2) == 5 and not dropped2
    # without a tool list the env's own verdicts decide
    blind = [P.PoolEntry(**{**e.model_dump(), "tool_names": []}) for e in entries]
    assert P.filter_entries(blind)[1] == {"undefined-tool": 1, "unparsable": 1}
    tok = AutoTokenizer.from_pretrained(str(tiny))
    n = [P.token_count(e, tok) for e in entries]
    short, why = P.filter_entries(entries, max_tokens=min(n), tokenizer=tok, drop_unparsable=False,
                                  drop_undefined_tools=False)
    assert why["over-token-limit"] == sum(1 for x in n if x > min(n)) and all(P.token_count(e, tok) <= min(n)
                                                                             for e in short)
    with pytest.raises(P.PoolError, match="tokenizer"):
        P.filter_entries(entries, max_tokens=10)
    capped = P.cap_per_task(entries, 1)
    assert sorted(e.task_id for e in capped) == ["write-000", "write-001", "write-002", "write-003"]
    balanced = P.balance_classes(entries, 1.0)
    assert sum(e.resolved for e in balanced) == 2 and len(balanced) == 4
    assert len(P.balance_classes(entries, 1.5)) == 5
    with pytest.raises(ValueError):
        P.cap_per_task(entries, 0)
    # proxy recordings: pooled through the CLI, trained per call
    calls = [CallRecord(index=i, call_id=f"c{i}", request={}, messages=[{"role": "user", "content": f"q{i}"}],
                        message={"role": "assistant", "content": f"answer {i}"}) for i in range(3)]
    recs = [RolloutRecord(rollout_id="r1", status="finished", reward=1.0, calls=calls, metadata={"task_id": "t1"}),
            RolloutRecord(rollout_id="r2", status="failed", error="harness crashed", calls=calls)]
    export = tmp_path / "proxy.jsonl"
    export.write_text("".join(r.model_dump_json() + "\n" for r in recs))
    pool_file = tmp_path / "claw.jsonl"
    r = CliRunner().invoke(main, ["pool", "add", str(export), "--pool", str(pool_file), "--policy-id", "claw"])
    assert r.exit_code == 0 and "added 1 of 1" in r.output and "skipped 1" in r.output, r.output
    (entry,) = P.read_pool(pool_file)
    assert entry.source == "proxy" and entry.task_id == "t1" and len(entry.calls) == 3
    r = CliRunner().invoke(main, ["train", "sft", "--pool", str(pool_file), "--model", str(tiny), "--mode", "calls",
                                  "--steps", "1", "--batch-size", "3", "--out", str(tmp_path / "sft")])
    assert r.exit_code == 0 and "3 examples" in r.output, r.output
    show = CliRunner().invoke(main, ["pool", "show", str(pool_file)])
    assert show.exit_code == 0 and json.loads(show.output)["policies"] == {"claw": 1}
    for text, why in (("not json\n", "not JSON"), ("[1]\n", "not a trajectory"),
                      ('{"format": "orchard-pool/1"}\n', "not a trajectory")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text)
        with pytest.raises(P.PoolError, match=why):
            P.from_file(bad, policy_id="p")
        r = CliRunner().invoke(main, ["pool", "show", str(bad)])
        assert r.exit_code != 0 and "bad.jsonl:1" in r.output
    with pytest.raises(P.PoolError, match="No such file"):
        P.from_file(tmp_path / "missing.jsonl", policy_id="p")
