"""The execution agent that runs inside every sandbox (see __main__.py for its API).

It is injected into images we do not control, so it uses the Python standard library
only, and it runs as a folder: `python3 -I -S -B path/to/agent/ --help` puts the folder
on sys.path[0] and runs __main__.py, whose siblings import each other by their plain
names (common, jobs, files, httpd, ptys, tunnel, scope). Importing this package runs nothing: it only
says where the folder is, for the backends that start or bind it.
"""

import os

AGENT_DIR = os.path.dirname(os.path.abspath(__file__))
