"""`orchard_verifiers`: verifiers' plugin name for the Orchard taskset and env.

verifiers 0.4 imports a taskset id as a top-level module (`orchard-verifiers` ->
`orchard_verifiers`; a dotted id is not found), so the wheel installs this folder under that
name (pyproject.toml `package-dir`). Everything lives in `orchard_gym.integrations.verifiers`.
"""

from orchard_gym.integrations.verifiers import OrchardEnv, OrchardTaskset, load_environment

__all__ = ["OrchardEnv", "OrchardTaskset", "load_environment"]
