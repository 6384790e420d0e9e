"""close() of a Runtime or Config while other threads are inside calls on it
(issue 9, part 3): close waits for the calls in flight, later calls raise
InvalidArgumentError("... is closed"), and nothing crashes. The hammering
runs in a child process (close_race_child.py) so that a segfault is a test
failure with its signal, not the end of pytest."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import flashattn as fa

HERE = os.path.dirname(os.path.abspath(__file__))


def _child(mode, rounds):
    env = dict(os.environ)
    env.setdefault("FLASHATTN_CACHE_DISABLE", "1")
    try:
        p = subprocess.run([sys.executable, os.path.join(HERE, "close_race_child.py"), mode,
                            str(rounds)], env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as e:
        pytest.fail("close_race_child.py %s: no result in 240 s (a deadlock?)\n%s\n%s"
                    % (mode, e.stdout, e.stderr))
    if p.returncode < 0:
        pytest.fail("close_race_child.py %s: killed by %s\nstdout: %s\nstderr: %s"
                    % (mode, signal.Signals(-p.returncode).name, p.stdout, p.stderr[-4000:]))
    assert p.returncode == 0 and p.stdout.startswith("OK"), (p.stdout, p.stderr[-4000:])
    return p.stdout


@pytest.mark.parametrize("mode", ["runtime", "config", "both"])
def test_close_while_threads_call(mode):
    out = _child(mode, 8)
    # the race was exercised: some threads were inside a call as close() began
    assert " 0 threads inside a call" not in out, out


def test_close_from_inside_a_call_raises_instead_of_deadlocking():
    _child("reentrant", 1)


def test_calls_after_close_raise(tmp_path):
    rt = fa.Runtime(backend="emulator", cache="memory")
    cfg = fa.Config(head_dim=32, num_heads_q=2)
    x = np.ones((1, 8, 2, 32), np.float16)
    d = rt.upload(x)
    rt.forward(cfg, x, x, x)
    cfg.close()
    assert cfg.closed and not rt.closed
    for call in (lambda: rt.forward(cfg, x, x, x), lambda: cfg.generate("decode"),
                 lambda: rt.decode(cfg, x, x, x, [8])):
        with pytest.raises(fa.InvalidArgumentError) as e:
            call()
        assert e.value.message == "the Config is closed"
    cfg.close()  # idempotent
    cfg2 = fa.Config(head_dim=32, num_heads_q=2)
    rt.close()
    assert rt.closed
    for call in (lambda: rt.forward(cfg2, x, x, x), lambda: rt.decode(cfg2, x, x, x, [8]),
                 lambda: rt.decode_reduce(cfg2, np.zeros((1, 1, 8, 2, 32), np.float32),
                                          np.zeros((1, 1, 2, 8), np.float32)),
                 lambda: rt.cache_stats(), lambda: rt.cache_list(), lambda: rt.cache_clear(),
                 lambda: rt.synchronize(), lambda: rt.memset(0, 0, 1), lambda: rt.upload(x),
                 lambda: d.numpy()):
        with pytest.raises(fa.InvalidArgumentError) as e:
            call()
        assert "closed" in e.value.message
    d.free()  # a no-op: close() freed it
    assert not rt._allocs
    cfg2.close()
