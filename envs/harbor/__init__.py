"""Orchard/Harbor-v0: Harbor task folders (env.py), read field by field (config.py, tasks.py),
their Dockerfiles as set-up on the local backend (dockerfile.py), graded out of the policy's
reach (verifier.py). See docs/harbor.md."""
