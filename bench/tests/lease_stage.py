"""Reads one stage of bench/gpu_lease.sh, for the tests that check a
benchmark's lease stage against that benchmark's own option parser."""

import os
import re

LEASE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu_lease.sh")


def lease_text():
    with open(LEASE) as f:
        return f.read()


def default_stages():
    """The stages gpu_lease.sh runs without --only, in its list's order."""
    line = [x for x in lease_text().splitlines() if x.startswith("only=")][0]
    return line.split("=", 1)[1].strip('"').split(",")


def stage(name, script):
    """(time limit s, benchmark budget s or None, the options given to
    script before --time-budget, with --out-dir and its value dropped) of
    the stage `name` (its command may continue over backslash-newlines)."""
    text = lease_text()
    i = text.index("stage %s " % name)
    end = i
    while True:  # the command's last line: the first that does not end in a backslash
        nl = text.index("\n", end)
        if not text[end:nl].rstrip().endswith("\\"):
            break
        end = nl + 1
    line = text[i:nl].replace("\\\n", " ")
    limit = int(line.split()[2])
    m = re.search(r'--time-budget "\$\(budget (\d+)\)"', line)
    budget = float(m.group(1)) if m else None
    args = line.split(script, 1)[1].split("--time-budget")[0].split()
    if "--out-dir" in args:
        j = args.index("--out-dir")
        del args[j:j + 2]
    return limit, budget, args
