"""Start a tool service from code sent on stdin: nothing it runs comes from a file the policy can write.

The env runs this file's text, not the file (`deploy.boot_argv`):

    PYTHON -I -S -B -c "$(cat claw_boot.py)" --socket PATH
    stdin, line 1: {"modules": [[name, source], ...], "main": name}; then the main module's own input

`-I`: no PYTHONPATH, no user site, neither the cwd nor a script's folder on `sys.path`, so
the import path is the interpreter's own library (read-only on every backend: the host's,
bound read-only by bubblewrap; the agent bundle's, a read-only volume in containers). The
service's modules are compiled from the text on stdin and put in `sys.modules`; none of
them is ever a file in the sandbox, which the policy could edit, or shadow with a module of
the same name next to it.

`ImportGuard` (first on `sys.meta_path`, installed before any other import) does two things:
- it notes every module that came from a place this process could write (and so could the
  policy, its processes being the same user): `writable` goes out in the service's hello
  and makes `hardened` false in its snapshots;
- `seal()`, which the service calls once its world is built and before it answers anyone,
  refuses every later import. A lazy import on an error path (socketserver's
  `handle_error` imports `traceback`) can then load no code, whatever is on disk.
Standard library only, and builtin modules only until the guard is in place.
"""

import posix
import sys


class ImportGuard:
    """A meta-path finder that finds nothing itself: it vets what the other finders find."""

    def __init__(self):
        self.sealed = False
        self.writable = []

    def find_spec(self, name, path=None, target=None):
        if self.sealed:
            raise ImportError(f"import of {name!r} refused: the service loads no code once it serves")
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        writable = [place for place in _places(spec) if posix.access(place, posix.W_OK)]
        if writable and writable[0] not in self.writable:
            self.writable.append(writable[0])
        return spec

    def seal(self):
        """No import from now on; returns the writable places code was loaded from so far."""
        self.sealed = True
        return list(self.writable)


def _places(spec):
    """The files and folders a module's code was read from (none for builtin and frozen ones)."""
    places = []
    if spec.has_location and spec.origin:
        folder = spec.origin.rpartition("/")[0]
        places += [folder, spec.origin, folder + "/__pycache__"] + ([spec.cached] if spec.cached else [])
    return places + list(spec.submodule_search_locations or [])


def boot(guard):
    import json

    header = json.loads(sys.stdin.readline())
    for name, source in header["modules"]:
        module = type(sys)(name)
        module.__file__ = f"<claw_boot>/{name}.py"  # a label for tracebacks: there is no such file
        sys.modules[name] = module
        exec(compile(source, module.__file__, "exec"), module.__dict__)
    return sys.modules[header["main"]].main(sys.argv[1:], seal=guard.seal)


if __name__ == "__main__":
    _guard = ImportGuard()
    sys.meta_path.insert(0, _guard)
    sys.path[:] = [p for p in sys.path if p.startswith("/")]  # no relative entry ('' is the cwd)
    sys.exit(boot(_guard))
