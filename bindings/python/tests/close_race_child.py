"""Child process of test_close_race.py: threads hammer one Runtime and one
Config (forward, decode, decode_reduce, memory helpers, cache queries, with
NumPy and with device-resident arrays) while the main thread closes the
Runtime, the Config, or both. A crash (the C handle destroyed under a call
in flight) kills this process with a signal, which the parent reports.

    python3 close_race_child.py MODE ROUNDS
MODE: runtime | config | both | reentrant. Prints OK and exits 0 when every
call either succeeded or raised InvalidArgumentError saying "closed", and
every call after close raised it."""

import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flashattn as fa  # noqa: E402
from flashattn import _lib  # noqa: E402

WORKERS = ("forward", "decode", "forward_device", "reduce", "memory", "forward", "decode")
USES_CONFIG = {"forward", "decode", "forward_device", "reduce"}


def problem(rt, cfg, seed):
    g = np.random.default_rng(seed)
    q = g.standard_normal((1, 48, 2, 32)).astype(np.float16)
    q1 = g.standard_normal((2, 1, 2, 32)).astype(np.float16)
    kc = g.standard_normal((2, 96, 2, 32)).astype(np.float16)
    lens = np.array([96, 50], np.int32)
    op = g.standard_normal((3, 2, 1, 2, 32)).astype(np.float32)
    lp = g.standard_normal((3, 2, 2, 1)).astype(np.float32)
    return q, q1, kc, lens, op, lp


def one_round(mode, seed):
    rt = fa.Runtime(backend="emulator", cache="memory")
    cfg = fa.Config(head_dim=32, num_heads_q=2)
    q, q1, kc, lens, op, lp = problem(rt, cfg, seed)
    dq = rt.upload(q)  # device-resident inputs and output
    do = rt.empty(q.shape, "fp16")
    started = threading.Barrier(len(WORKERS) + 1)
    closed_at = []  # time.monotonic() once close() has returned
    errors, calls, refused = [], [0], [0]
    lock = threading.Lock()

    def call(kind):
        if kind == "forward":
            rt.forward(cfg, q, q, q)
        elif kind == "decode":
            rt.decode(cfg, q1, kc, kc, lens)
        elif kind == "forward_device":
            fa.forward(rt, cfg, dq, dq, dq, out=do)
        elif kind == "reduce":
            rt.decode_reduce(cfg, op, lp)
        elif kind == "memory":
            d = rt.upload(q)
            d.numpy()
            d.free()
            rt.cache_stats()
            rt.synchronize()
            rt.info

    # Whether the closed handle(s) are used by a kind of call.
    affected = {k: mode != "config" or k in USES_CONFIG for k in WORKERS}

    def worker(kind):
        started.wait()
        after = 0
        while after < 3:  # keep calling until three calls were refused after close
            was_closed = bool(closed_at)
            try:
                call(kind)
                with lock:
                    calls[0] += 1
                if was_closed:
                    if affected[kind]:
                        # a call that started after close() returned must not succeed
                        errors.append("%s succeeded after close" % kind)
                    return
            except fa.InvalidArgumentError as e:
                if "closed" not in e.message:
                    errors.append("%s: %r" % (kind, e))
                    return
                with lock:
                    refused[0] += 1
                if not affected[kind]:
                    errors.append("%s: refused, but it does not use what was closed" % kind)
                    return
                if was_closed:
                    after += 1
            except BaseException as e:  # noqa: BLE001 (reported to the parent)
                errors.append("%s: %s: %r" % (kind, type(e).__name__, e))
                return

    threads = [threading.Thread(target=worker, args=(k,)) for k in WORKERS]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(0.02 + 0.01 * (seed % 5))  # let the workers get into their calls
    # calls in flight as close() begins (0 with a binding that counts none)
    guard = getattr(cfg if mode == "config" else rt, "_guard", None)
    in_flight = len(getattr(guard, "_users", ()))
    if mode in ("runtime", "both"):
        rt.close()
        assert rt.closed
    if mode in ("config", "both"):
        cfg.close()
        assert cfg.closed
    closed_at.append(time.monotonic())
    for t in threads:
        t.join(60)
        if t.is_alive():
            errors.append("a worker is still running 60 s after close")
    # close() is idempotent; every later call raises the binding's error.
    rt.close()
    cfg.close()
    for f in (lambda: rt.forward(cfg, q, q, q), lambda: rt.malloc(16), lambda: rt.info,
              lambda: cfg.generate("forward")):
        try:
            f()
            errors.append("a call after close succeeded")
        except fa.InvalidArgumentError as e:
            if "closed" not in e.message:
                errors.append("after close: %r" % e)
    return errors, calls[0], refused[0], in_flight


def reentrant():
    """close() from inside a call on the same thread must raise, not
    deadlock waiting for itself; the call then completes."""
    rt = fa.Runtime(backend="emulator", cache="memory")
    cfg = fa.Config(head_dim=32, num_heads_q=2)
    lib = _lib.lib()
    real = lib.fa_launch
    seen = []

    def spy(*args):
        for obj in (rt, cfg):
            try:
                obj.close()
                seen.append("close() inside a call returned")
            except fa.InvalidArgumentError as e:
                seen.append(e.message)
        return real(*args)

    lib.fa_launch = spy
    try:
        x = np.ones((1, 8, 2, 32), np.float16)
        o = rt.forward(cfg, x, x, x)
        assert o.shape == x.shape
    finally:
        lib.fa_launch = real
    errors = [m for m in seen if "inside a call" not in m]
    if len(seen) != 2:
        errors.append("spy saw %r" % seen)
    rt.close()
    cfg.close()
    if not (rt.closed and cfg.closed):
        errors.append("not closed afterwards")
    return errors


def main():
    mode, rounds = sys.argv[1], int(sys.argv[2])
    if mode == "reentrant":
        errors = reentrant()
        if errors:
            print("\n".join(errors))
            return 1
        print("OK")
        return 0
    total_calls = total_refused = total_in_flight = 0
    for r in range(rounds):
        errors, calls, refused, in_flight = one_round(mode, r)
        if errors:
            print("round %d:\n  %s" % (r, "\n  ".join(errors[:10])))
            return 1
        total_calls += calls
        total_refused += refused
        total_in_flight += in_flight
    print("OK %s: %d rounds, %d calls, %d refused, %d threads inside a call as close() began"
          % (mode, rounds, total_calls, total_refused, total_in_flight))
    return 0


if __name__ == "__main__":
    sys.exit(main())
