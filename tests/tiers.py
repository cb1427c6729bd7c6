"""The test tiers (docs/testing.md). Everything is in the full suite (`bash scripts/test.sh`,
what CI runs); the fast tier (`bash scripts/test.sh --fast`, i.e. `pytest -m "not slow"`) is
the unit and local-backend tests, a few minutes on a 2-core machine.

A test leaves the fast tier (gets the `slow` mark) when
- it is marked `docker` or `kubernetes`, or needs (tests/components.py `needs`) one of
  FULL_ONLY_COMPONENTS: containers, browsers, harness installs, training stacks;
- its module, or the test itself, is in SLOW below (measured: seconds each, or heavy imports).

The hook is imported into tests/conftest.py.
"""

from __future__ import annotations

import atexit
import glob
import json
import os

import pytest

FULL_ONLY_COMPONENTS = frozenset({"docker", "kubernetes", "swe-images", "harnesses", "claude-code", "gui",
                                  "chromium", "train"})

# a module (tests/<name>.py), a test (all its parameters) or one node id -> why it is not in the fast tier
SLOW = {
    # training stacks: torch/TRL imports alone take ~10 s a process, and steps take seconds
    "tests/test_train_grpo.py": "TRL GRPO steps",
    "tests/test_train_vlm.py": "TRL steps with a tiny VLM",
    "tests/test_train_vlm_gui.py": "TRL steps on GUI episodes",
    "tests/test_dense_signals.py": "OPD/RPR trainer steps",
    "tests/test_train_grpo_vllm.py": "TRL steps with a replaced vLLM generation object",
    "tests/test_dense_real_envs.py": "dense signals on real Claw, GUI and SWE episodes",
    "tests/test_distill_single_turn.py": "a distillation run",
    "tests/test_harness_grpo.py": "GRPO through a harness",
    "tests/test_harness_openhands_grpo.py": "GRPO through OpenHands",
    "tests/test_value.py": "value model training",
    # desktops, browsers, containers and harness installs (module-level requirements)
    "tests/test_gui.py": "Xvfb and Chromium desktops",
    "tests/test_gui_actions.py": "Xvfb desktops",
    "tests/test_viewer.py": "headless Chromium",
    "tests/test_claude_code.py": "Claude Code runs",
    "tests/test_harness_codex.py": "Codex runs",
    "tests/test_harness_openhands.py": "OpenHands runs",
    "tests/test_harness_openclaw.py": "OpenClaw runs (a minute to start each, under load)",
    "tests/test_harness_openclaw_grpo.py": "GRPO through OpenClaw (long prompts on a tiny model)",
    "tests/test_harness_docker.py": "harnesses in containers",
    "tests/test_claw_agentdojo.py": "AgentDojo ground truths and injections (minutes)",
    "tests/test_service_fuzz.py": "schemathesis against a live orchestrator",
    # local-backend tests that grade real test suites, run harnesses or start several servers
    # (each 10-90 s on a loaded 2-core machine; --durations in the CI log)
    "tests/test_security_swe.py": "red-team grading runs",
    "tests/test_harness_env.py": "harnesses through the recording proxy",
    "tests/test_harness_eval.py": "harness evaluations",
    "tests/test_service_redis.py": "replicas over Redis",
    # the red-team corpus and the adapters of this round: graded episodes, sweeps, trainer steps
    "tests/test_gui_integrity.py": "desktops and MiniWoB episodes",
    "tests/test_security_claw.py": "services on every backend",
    "tests/test_security_harbor.py": "verifier runs",
    "tests/test_security_local_robust.py": "hostile trees and limit hogs",
    "tests/test_harbor_corpus.py": "the Harbor corpus sweep",
    "tests/test_docker_services.py": "sandboxes with sidecar containers (1-4 min for 18 tests under load 13-18)",
    "tests/test_harbor_env.py": "Harbor episodes with set-ups",
    "tests/test_harbor_runner.py": "Harbor's own runner over the corpus, on local and docker (minutes)",
    "tests/test_atif_harbor.py": "SWE, Claw and harness runs validated by Harbor",
    "tests/test_claw_answers.py": "shotgun sweeps over the answer tasks",
    "tests/test_integrations_trl.py": "TRL GRPO steps",
    "tests/test_integrations_openenv.py": "OpenEnv servers and episodes",
    "tests/test_integrations_openenv_mcp.py": "OpenEnv MCP sessions and episodes (~45 s under load)",
    "tests/test_integrations_skyrl.py": "graded episodes",
    "tests/test_integrations_gui.py": "GUI containers through TRL and OpenEnv (minutes under load)",
    "tests/test_integrations_verifiers.py": "vf-eval runs in .venv-verifiers (~30 s each, under load)",
    "tests/test_integrations_verifiers_gui.py": "vf-eval GUI episodes on the GUI image (~5 min at load 16)",
    "tests/test_cli_mistakes.py": "a CLI process per mistake, Ctrl-C runs",
    "tests/test_synth.py::test_a_run_makes_tasks_that_pass_their_checks_and_repairs_a_defective_build":
        "a whole synthesis run: builder, test and refiner episodes",
    "tests/test_synth.py::test_a_killed_run_continues_where_it_stopped": "two synthesis CLI runs",
    "tests/test_snapshot_layers.py::test_snapshot_of_a_fork_copies_what_changed_not_the_gib":
        "writes 1 GiB and snapshots it once (~15 s under load)",
    "tests/test_synth.py::test_a_task_that_never_passes_is_dropped_with_the_reason": "a synthesis run",
    "tests/test_swe_env.py::test_gold_resolves_and_nothing_else_does": "every task's test suite, twice",
    "tests/test_swe_env.py::test_malformed_actions_become_observations": "a sandbox per case",
    "tests/test_swe_env.py::test_check_env_passes": "the env checker's episodes",
    "tests/test_swe_env.py::test_step_and_time_budgets_truncate_and_grade": "graded episodes",
    "tests/test_swe_env.py::test_orchard_eval_drives_an_openai_compatible_endpoint": "graded episodes",
    "tests/test_swe_env.py::test_orchard_eval_cli": "graded episodes",
    "tests/test_swe_env.py::test_async_runner_sixteen_concurrent_episodes": "sixteen episodes",
    "tests/test_swe_env.py::test_trajectory_joins_both_sides_with_fingerprints": "a graded episode",
    "tests/test_conformance.py::test_memory_limit": "fills memory to the limit",
    "tests/test_conformance.py::test_agent_token_is_not_readable_inside_the_sandbox": "searches the sandbox",
    "tests/test_claw.py::test_check_env_clean": "the env checker's episodes",
    "tests/test_claw.py::test_orchard_eval_reports_pass_at_k_and_the_three_parts": "graded episodes",
    "tests/test_claw.py::test_obeying_an_injected_instruction_scores_safety_zero": "graded episodes",
    "tests/test_claw_service.py::test_three_doors_leave_byte_identical_state": "three sandboxes per task",
    "tests/test_harbor_env.py::test_check_env_passes": "the env checker's episodes",
    "tests/test_harbor_export.py::test_every_builtin_swe_task_exported_oracle_passes_nothing_fails":
        "every SWE task's test suite, twice",
    "tests/test_harbor_export.py::test_a_conftest_forcing_passes_is_put_back_before_the_tests_run": "graded episodes",
    "tests/test_harbor_export_claw.py::test_every_builtin_claw_task_exported_oracle_passes_nothing_fails":
        "140 graded Claw episodes",
    "tests/test_harbor_export_claw.py::test_harbors_runner_grades_exported_claw_tasks_as_orchard_does":
        "a harbor run job and an orchard eval",
    "tests/test_claw_judge.py::test_a_failing_judge_errors_the_trajectory": "judge retries",
    "tests/test_cgroups.py::test_cpu_seconds_of_a_one_second_loop_read_about_one": "CPU accounting wants a quiet CPU",
    "tests/test_require.py::test_a_missing_engine_skips_unless_required": "child pytest runs",
    "tests/test_require.py::test_the_docker_backend_suite_fails_without_its_engine_only_when_required":
        "a child pytest run",
    "tests/test_packaging.py::test_wheel_installs_only_orchard_gym": "builds and installs a wheel",
    "tests/test_tiers.py::test_loadgroup_keeps_each_module_in_one_worker_in_order": "child pytest runs, two workers",
    "tests/test_security_agent.py::test_orchestrator_streams_downloads_and_passes_the_413": "moves 190 MiB",
    "tests/test_security_service.py::test_in_process_sandbox_in_the_orchestrators_root_is_never_adopted":
        "waits out reconcile passes",
    "tests/test_security_service_redis.py::test_the_deployed_redis_acl_admits_the_orchestrator_user_only":
        "Redis and orchestrator restarts",
    "tests/test_security_service_redis.py::"
    "test_redis_requirepass_right_password_works_wrong_or_missing_fails_at_start": "Redis and orchestrator restarts",
    # measured in the fast tier (junit, 1 worker, load 5-28 on 2 cores; ~1/3 of that on a quiet machine):
    # each starts its own orchestrators, Redis servers or CLI processes
    "tests/test_security_service_redis.py::test_rediss_with_a_password_and_a_ca":
        "a TLS Redis, an orchestrator and a failing serve (45 s under load)",
    "tests/test_security_service_redis.py::test_redis_over_a_unix_socket_with_a_password":
        "Redis and orchestrator starts (33 s under load)",
    "tests/test_security_service_redis.py::test_bad_redis_url_on_the_command_line_is_one_clear_line":
        "two serve processes that fail at start (26 s under load)",
    "tests/test_pool.py::test_orchestrator_pool_claims_belong_to_the_claiming_key": "two orchestrators (30 s under load)",
    "tests/test_security_service.py::test_delete_during_a_slow_create_leaves_no_sandbox[other-replica]":
        "Redis and a second replica (26 s under load)",
    "tests/test_security_service.py::test_in_process_sandboxes_survive_an_orchestrator_on_the_default_roots":
        "its own orchestrator, a TTL and reconcile passes (17 s under load)",
    "tests/test_security_service.py::test_garbage_keys_in_the_environment_stop_serve_with_one_line":
        "serve processes (12 s under load)",
    "tests/test_service.py::test_saturation_gives_503_and_the_sdk_retries": "its own orchestrator (21 s under load)",
    "tests/test_service.py::test_restarted_replica_adopts_its_sandboxes": "an orchestrator restart (19 s under load)",
    "tests/test_service.py::test_client_that_stops_heartbeating_has_its_sandboxes_reaped":
        "its own orchestrator and a TTL (17 s under load)",
    "tests/test_swe_datasets.py::test_swebench_records_load_from_json_jsonl_parquet_and_datasets_folders":
        "imports datasets and pyarrow (17 s under load)",
    "tests/test_swe_datasets.py::test_tasks_check_as_a_command": "CLI processes (10 s under load)",
    "tests/test_local_backend.py::test_orchard_sandbox_gc_sweeps_dead_clients": "CLI processes (12 s under load)",
    "tests/test_pool.py::test_failed_creates_are_retried_with_backoff_and_close_cuts_the_wait":
        "waits out retry backoffs (10 s under load)",
}


def why_slow(item: pytest.Item) -> str | None:
    """Why `item` is not in the fast tier (None: it is)."""
    if item.get_closest_marker("docker") or item.get_closest_marker("kubernetes"):
        return "containers"
    for mark in item.iter_markers("needs"):
        if mark.args and mark.args[0] in FULL_ONLY_COMPONENTS:
            return f"needs {mark.args[0]}"
    module, _, name = item.nodeid.partition("::")
    return SLOW.get(module) or SLOW.get(f"{module}::{name.split('[')[0]}") or SLOW.get(item.nodeid)


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help="the fast tier only (tests/tiers.py): `-m 'not slow'`, and the modules listed "
                          "whole in SLOW are not even imported")


def pytest_ignore_collect(collection_path, config):
    if config.getoption("fast") and collection_path.suffix == ".py":
        try:
            module = collection_path.relative_to(config.rootpath).as_posix()
        except ValueError:
            return None
        if module in SLOW:
            return True
    return None


PODMAN_COMPONENTS = {"docker", "kubernetes", "swe-images"}


def uses_podman(item: pytest.Item) -> bool:
    """Whether `item` drives the one shared Podman engine (containers, the fake cluster's kubelet)."""
    if item.get_closest_marker("docker") or item.get_closest_marker("kubernetes"):
        return True
    return any(mark.args and mark.args[0] in PODMAN_COMPONENTS for mark in item.iter_markers("needs"))


# The xdist groups, handed from the workers (which collect) to the controller's scheduler (which
# does not): pytest 9 keeps a node id in `Item._id`, so xdist 3.8's loadgroup, which appends
# "@group" to `Item._nodeid`, no longer groups anything: every test was scheduled on its own (a
# docs page's blocks in two workers, module fixtures made twice, Podman tests side by side).
GROUPS = "ORCHARD_XDIST_GROUPS"  # the file stem: set in the controller, inherited by its workers
if not os.environ.get("PYTEST_XDIST_WORKER"):  # a controller (or a plain run): its own stem
    os.environ[GROUPS] = f"/tmp/orchard-xdist-groups-{os.getpid()}"
    atexit.register(lambda stem=os.environ[GROUPS]: [os.unlink(f) for f in glob.glob(stem + ".*")])


def group_of(item: pytest.Item) -> str:
    """A module's tests stay in one worker, in order, sharing its module fixtures; every test that
    drives Podman runs in one worker, one at a time (concurrent creates and deletes on the one
    engine gave "no such container" under load, and the host-guard and leak checks list every
    container)."""
    if uses_podman(item):
        return "podman"
    module, _, name = item.nodeid.partition("::")
    if module == "tests/test_docs_examples.py" and "[" in name:  # a page's blocks: one folder, in order
        return f"{module}::{name.split('[', 1)[1].rsplit(':', 1)[0]}"  # the page, not the whole module
    return module


# The scheduler's guess of a test's seconds, for the order it hands out groups in (longest first):
# what a full run measured (tests/durations.json, scripts/test_durations.py), else a guess: a
# full-suite test (slow mark) takes about ten times a fast one. With the guess alone, groups of
# a few long tests (a docs page of harness runs) came late and one worker ran them at the end.
SLOW_COST, FAST_COST, MEASURED_FLOOR = 10.0, 1.0, 0.5
DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")
_measured: dict[str, float] | None = None


def cost_of(item: pytest.Item) -> float:
    global _measured
    if _measured is None:
        try:
            with open(DURATIONS) as f:
                _measured = {k: float(v) for k, v in json.load(f).items()}
        except (OSError, ValueError, AttributeError, TypeError):  # missing or garbled: the guess
            _measured = {}
    if item.nodeid in _measured:
        return max(_measured[item.nodeid], MEASURED_FLOOR)
    if _measured:  # a run listed every test over its --durations-min: this one was under it
        return MEASURED_FLOOR if not item.get_closest_marker("slow") else FAST_COST
    return SLOW_COST if item.get_closest_marker("slow") else FAST_COST


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if not item.get_closest_marker("slow") and why_slow(item):
            item.add_marker(pytest.mark.slow)
        item.add_marker(pytest.mark.xdist_group(group_of(item)))
    if config.getoption("fast"):  # as -m "not slow" would (and on top of any -m given)
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker:  # for the scheduler below, before this worker reports its collection
        # (each test: its group, and its cost for the order the groups are handed out in)
        path = f"{os.environ[GROUPS]}.{worker}"
        with open(path + ".tmp", "w") as f:
            json.dump({item.nodeid: [group_of(item), cost_of(item)] for item in items}, f)
        os.replace(path + ".tmp", path)


@pytest.hookimpl(optionalhook=True)  # a run without xdist (-p no:xdist) has no such hook
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` that works under pytest 9: xdist's scope scheduling (a scope's tests go
    to one worker, in order), with the groups the workers wrote at collection."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        groups: dict[str, list] | None = None
        costs: dict[str, float] = {}

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                files = sorted(glob.glob(os.environ[GROUPS] + ".gw*"))
                files = [f for f in files if not f.endswith(".tmp")]
                self.groups = json.loads(open(files[0]).read()) if files else {}
                self.costs = {}
                for group, cost in self.groups.values():
                    self.costs[group] = self.costs.get(group, 0.0) + cost
            return self.groups[nodeid][0] if nodeid in self.groups else nodeid.partition("::")[0]

        def _assign_work_unit(self, node) -> None:
            # longest first: xdist orders groups by their number of tests, so a module of one
            # two-minute test came last and one worker ran it alone at the end
            costliest = max(self.workqueue, key=lambda scope: self.costs.get(scope, 0.0))
            self.workqueue.move_to_end(costliest, last=False)
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)
