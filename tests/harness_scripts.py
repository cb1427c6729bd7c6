"""Small real harnesses for tests: stdlib Python programs that own their loop and call
the model API at $OPENAI_BASE_URL, run inside the sandbox like any harness."""

from __future__ import annotations

from orchard_gym.wrappers.harness import Harness

# A minimal ReAct harness: bash tool calls run in the task's directory, "DONE" ends it.
# HARNESS_MODE: "normal" | "crash-after-1" (exit 3 after one answer) | "die-mid-call"
# (exits while its second request is still waiting) | "no-call" (exits 0 at once) |
# "hang" (sleeps after its first answer) | "stream" (asks for SSE answers).
REACT = r'''
import json, os, subprocess, sys, threading, time, urllib.request
mode = os.environ.get("HARNESS_MODE", "normal")
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
if mode == "no-call":
    sys.exit(0)
tools = [{"type": "function", "function": {"name": "bash", "description": "run a command",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
messages = [{"role": "system", "content": "You are a test harness."},
            {"role": "user", "content": open(os.environ["ORCHARD_TASK_FILE"]).read()[:200]}]

def ask():
    body = {"model": os.environ["ORCHARD_MODEL"], "messages": messages, "tools": tools, "tool_choice": "auto",
            "temperature": 0.0, "stream": mode == "stream"}
    req = urllib.request.Request(base + "/chat/completions", json.dumps(body).encode(),
                                 {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        raw = resp.read().decode()
    if mode != "stream":
        return json.loads(raw)["choices"][0]["message"]
    content, calls = "", {}
    for line in raw.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for ch in json.loads(line[6:])["choices"]:
                d = ch["delta"]
                content += d.get("content") or ""
                for c in d.get("tool_calls") or []:
                    slot = calls.setdefault(c["index"], {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                    slot["id"] = c.get("id") or slot["id"]
                    slot["function"]["name"] += (c.get("function") or {}).get("name") or ""
                    slot["function"]["arguments"] += (c.get("function") or {}).get("arguments") or ""
    msg = {"role": "assistant", "content": content or None}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg

for turn in range(50):
    if mode == "die-mid-call" and turn == 1:
        threading.Thread(target=ask, daemon=True).start()
        time.sleep(1.0)
        os._exit(7)
    msg = ask()
    messages.append(msg)
    if mode == "crash-after-1":
        sys.exit(3)
    if mode == "hang":
        time.sleep(3600)
    if msg.get("tool_calls"):
        for call in msg["tool_calls"]:
            cmd = json.loads(call["function"]["arguments"])["command"]
            out = subprocess.run(cmd, shell=True, capture_output=True, text=True)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": out.stdout + out.stderr})
    elif "DONE" in (msg.get("content") or ""):
        sys.exit(0)
    else:
        messages.append({"role": "user", "content": "use the bash tool, or say DONE"})
sys.exit(0)
'''

REACT_HARNESS = Harness(name="test-react", command="python3 - <<'ORCHARD_EOF'\n" + REACT + "ORCHARD_EOF")


def react(mode: str = "normal") -> Harness:
    return REACT_HARNESS.model_copy(update={"env": {"HARNESS_MODE": mode}})
