"""Deprecated name of orchard_gym/screenshots.py (image observations as chat content, screenshot
files): `images` reads as container images here. This module is that one under its old name."""

from __future__ import annotations

import sys
import warnings

from . import screenshots

warnings.warn("orchard_gym.images is now orchard_gym.screenshots", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = screenshots
