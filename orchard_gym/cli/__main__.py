"""`python -m orchard_gym.cli ...`: the `orchard` command."""

from . import main

main()
