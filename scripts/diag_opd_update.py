"""Diagnostic for OPD outside the agent loop: the per-token update with A_t = log pT(a_t) - log pS(a_t)
on the student's own single-turn samples (plain torch, no TRL, no env) and the exact full-vocabulary
reverse KL on those samples after each step.

    python scripts/diag_opd_update.py runs/demo-opd-b 1e-3 8      # a folder from demo_opd.py, lr, steps
"""
import sys
import torch
torch.set_num_threads(1); torch.manual_seed(0)
from transformers import AutoModelForCausalLM, AutoTokenizer
d = sys.argv[1]; lr = float(sys.argv[2]); steps = int(sys.argv[3])
tok = AutoTokenizer.from_pretrained(f"{d}/student")
S = AutoModelForCausalLM.from_pretrained(f"{d}/student"); T = AutoModelForCausalLM.from_pretrained(f"{d}/teacher")
from orchard_gym.envs.toy.env import make_tasks
tasks = make_tasks(kinds=["write", "secret", "count"], num_tasks=16, seed=0, variety=1)
sysmsg = "You act in a sandbox with the tools bash and submit. Reply with one tool call."
prompts = [tok.apply_chat_template([{"role":"system","content":sysmsg},{"role":"user","content":t.instruction+" Then call submit."}], add_generation_prompt=True, tokenize=False) for t in list(tasks.values())[:16]]
P = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
def sample(model, n=40):
    out=[]
    for p in P:
        g = model.generate(torch.tensor([p]), do_sample=True, max_new_tokens=n, top_k=0, top_p=1.0, temperature=1.0, pad_token_id=tok.pad_token_id)
        out.append((p, g[0].tolist()))
    return out
def exact_kl(model, seqs):
    tot=n=0
    with torch.no_grad():
        for p, s in seqs:
            ls = torch.log_softmax(model(torch.tensor([s])).logits[0, len(p)-1:-1], -1)
            lt = torch.log_softmax(T(torch.tensor([s])).logits[0, len(p)-1:-1], -1)
            tot += (ls.exp() * (ls - lt)).sum().item(); n += len(s) - len(p)
    return tot / n
opt = torch.optim.Adam(S.parameters(), lr=lr)
S.eval()
for step in range(steps + 1):
    with torch.no_grad():
        seqs = sample(S)
    print(step, "exact reverse KL on own samples:", round(exact_kl(S, seqs), 4), flush=True)
    if step == steps: break
    loss = 0; ntok = 0
    for p, s in seqs:
        x = torch.tensor([s]); ls = torch.log_softmax(S(x).logits[0, len(p)-1:-1], -1)
        with torch.no_grad(): lt = torch.log_softmax(T(x).logits[0, len(p)-1:-1], -1)
        a = x[0, len(p):]
        lps = ls.gather(-1, a[:, None]).squeeze(-1); lpt = lt.gather(-1, a[:, None]).squeeze(-1)
        adv = (lpt - lps).detach()
        loss = loss - (adv * torch.exp(lps - lps.detach())).sum(); ntok += len(a)
    opt.zero_grad(); (loss / ntok).backward(); opt.step()
