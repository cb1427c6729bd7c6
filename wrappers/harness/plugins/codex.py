"""OpenAI's Codex CLI (npm `@openai/codex`: a launcher and a static native binary),
unchanged, `codex exec` (non-interactive), with the proxy as its model provider through its
own config file (`$CODEX_HOME/config.toml`, wire_api = "responses": it streams the
Responses API, with its shell tool `exec_command`). Its own sandbox and
approvals are off: it already runs inside the task's sandbox. The task text is its stdin."""

from ..spec import Harness

VERSION = "0.171.0"
# the package's own static (musl) binary, run directly: node (the npm launcher's runtime) is
# not needed in the sandbox, so task images need nothing added
BINARY = "node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"

CONFIG = """\
model = "{model}"
model_provider = "orchard"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
hide_agent_reasoning = true
web_search = "disabled"          # the sandbox has no network but the proxy

[features]
enable_request_compression = false   # the proxy reads plain JSON bodies (no zstd)
multi_agent = false                  # one agent: one rollout
goals = false

[model_providers.orchard]
name = "orchard recording proxy"
base_url = "{base_url}"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[feedback]
enabled = false

[history]
persistence = "none"
"""

HARNESS = Harness(
    name="codex",
    npm=[f"@openai/codex@{VERSION}"],
    files={"codex/config.toml": CONFIG},
    task_input="stdin",
    sandbox_payload=[BINARY],
    command=(f'"$ORCHARD_HARNESS_NPM/{BINARY}" exec --skip-git-repo-check '
             '--dangerously-bypass-approvals-and-sandbox --color never -C "$PWD" -'),
    shell_tool="exec_command", shell_argument="cmd",
    finish="Done.",  # a turn without tool calls ends `codex exec`
    env={"CODEX_HOME": "{harness_dir}/codex", "NO_COLOR": "1", "TERM": "dumb", "RUST_LOG": "error"},
)
