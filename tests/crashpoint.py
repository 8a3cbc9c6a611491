"""Run the ``subzero`` command line in this Python and kill it with SIGKILL at a crash
point: the Nth call of a function (``module:qualname``), in any thread.  Nothing of
SubZero knows it is watched; the kill is as real as a power cut to this process.

    python tests/crashpoint.py subzero.runs.record:write 1 -- run wf.py --store s

Exits 99 when the point was never reached (the test then knows its point is stale).
"""

import os
import signal
import sys
import threading


def main() -> int:
    target, nth = sys.argv[1], int(sys.argv[2])
    args = sys.argv[sys.argv.index("--") + 1:]
    module, qualname = target.split(":")
    seen = 0

    def watch(frame, event, arg):           # a profile hook: calls only, cheap enough
        nonlocal seen
        if event == "call" and frame.f_code.co_qualname == qualname \
                and frame.f_globals.get("__name__") == module:
            seen += 1
            if seen == nth:
                os.kill(os.getpid(), signal.SIGKILL)

    threading.setprofile(watch)
    sys.setprofile(watch)
    from subzero.cli import main as cli
    sys.argv = ["subzero", *args]
    code = cli(args)
    sys.setprofile(None)
    return 99 if seen < nth else code


if __name__ == "__main__":
    sys.exit(main())
