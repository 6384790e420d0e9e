"""Offline cache warming (fa_cache_warm, library 0.7): fill a kernel cache,
with no GPU, for the SMs a fleet runs."""

import ctypes
import os
from dataclasses import dataclass

from . import _lib
from ._errors import check, invalid


@dataclass(frozen=True)
class WarmCounts:
    """The counts of a cache_warm call (fa_cache_warm_progress): so far, as
    given to a progress callback, or in all, as cache_warm returns them."""

    total: int  # distinct kernels asked for: (spec line, SM) pairs that SM runs
    done: int  # of which finished: built + present + failed
    built: int  # rows written
    present: int  # rows already there with this compiler's binary
    failed: int  # kernels the compiler rejected
    skipped: int  # (spec line, SM) pairs that SM cannot run: not in total
    bytes: int  # PTX + binary bytes of the rows written
    seconds: float  # wall time since the call began
    spec: str  # progress: the kernel just finished (as CacheEntry.spec); result: ""
    sm: int  # progress: its SM; result: 0
    compiler: str  # the PTX compiler plugin's version, or "" (PTX rows)


def _counts(p):
    return WarmCounts(p.total, p.done, p.built, p.present, p.failed, p.skipped, p.bytes,
                      p.seconds, (p.spec or b"").decode("utf-8", "replace"), p.sm,
                      p.compiler.decode("utf-8", "replace"))


def _sm(item, where):
    """One SM as an int: 90, "90", "90a", "sm_100a" (the CLI's --sm forms)."""
    if isinstance(item, bool):
        raise invalid("%s must be an SM (80, \"90a\", \"sm_100a\", ...), got %r" % (where, item))
    if isinstance(item, int):
        value = item
    elif isinstance(item, str):
        digits = item[3:] if item.startswith("sm_") else item
        if digits[-1:] in ("a", "f"):
            digits = digits[:-1]
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 4):
            raise invalid("%s: %r is not an SM (80, \"90a\", \"sm_100a\", ...)" % (where, item))
        value = int(digits)
    else:
        raise invalid("%s must be an SM (80, \"90a\", \"sm_100a\", ...), got %r" % (where, item))
    if not -2**31 <= value < 2**31:
        raise invalid("%s = %d does not fit int32" % (where, value))
    return value


def _sms(sms):
    """sms as a list of ints: one SM, a comma-separated str, or an iterable."""
    if isinstance(sms, str):
        items = sms.split(",")
    elif isinstance(sms, (int, bool)):
        items = [sms]
    else:
        try:
            items = list(sms)
        except TypeError:
            raise invalid("cache_warm: sms must be an SM or a list of them, got %r"
                          % (sms,)) from None
    out = [_sm(item, "cache_warm: sms[%d]" % i) for i, item in enumerate(items)]
    if not out:
        raise invalid("cache_warm: sms names no SM")
    return out


def _text(value, sep, what):
    """None, a str, or a list of str joined by sep, as UTF-8 bytes."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8")
    try:
        items = list(value)
    except TypeError:
        raise invalid("cache_warm: %s must be a str or a list of str, got %r"
                      % (what, value)) from None
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise invalid("cache_warm: %s[%d] must be a str, got %r" % (what, i, item))
    return sep.join(items).encode("utf-8")


def cache_warm(sms, presets=None, specs=None, *, cache_dir=None, jobs=0, ptx_only=False,
               progress=None):
    """Fills a kernel cache, with no GPU or driver, with the rows a runtime on
    each SM in `sms` would build for the kernels that `presets` and `specs`
    name (fa_cache_warm; cache/README.md, "Warming"). A Runtime on such a GPU
    (or an emulator Runtime with that emulator_sm) over the cache then
    compiles nothing (cache_stats().compiles == 0).

    sms: an SM or a list of them, each an int (80, 90, 100, ...) or a str as
      `flashattn cache warm --sm` takes it ("90a", "sm_100a": the sm_ prefix
      and an a/f suffix are dropped; a str may list several, "80,90a").
      Supported: 80, 86, 87, 89, 90, 100, 103, 110, 120, 121.
    presets: a preset name (cache_warm_presets()), a comma-separated list of
      them, or a list of names; or None.
    specs: spec lines (forward|decode|reduce key=value ...), a str or a list
      of lines (joined with newlines: "specs line N" in errors counts them
      from 1); or None. At least one of presets and specs.
    cache_dir: the cache directory (str or path), as Runtime(cache_dir=...);
      None: the default ($FLASHATTN_CACHE_DIR, $XDG_CACHE_HOME/flashattn,
      ~/.cache/flashattn). It must pass the library's trust checks (owned by
      this user, not writable by others) and be writable.
    jobs: kernels compiled at once; 0 = the online CPUs.
    ptx_only: True writes PTX rows (JIT-compiled by the device's driver on
      first use); False builds cubins with the PTX compiler plugin when one
      is found, else writes PTX rows.
    progress: a callable given a WarmCounts (with .spec and .sm of the kernel
      just finished) after each kernel, on this thread. An exception it
      raises cannot stop the C call: the remaining kernels are warmed without
      further progress calls, then the exception is raised.

    Returns the WarmCounts of the call (.spec "", .sm 0). Errors (flashattn.Error
    subclasses): InvalidArgumentError (no SM, a bad sms item, jobs < 0, an
    unknown preset, a spec line that does not parse or that Config /
    generate would refuse: the message names the line and the key),
    UnsupportedError (an SM not supported), CacheError (the directory cannot
    be used or written: nothing written), CompileError (some kernels failed:
    the others are written; the error's .counts holds the WarmCounts).
    Thread safety: any thread; several processes may warm one cache."""
    sm_list = _sms(sms)
    preset_bytes = _text(presets, ",", "presets")
    spec_bytes = _text(specs, "\n", "specs")
    if isinstance(jobs, bool) or not isinstance(jobs, int):
        raise invalid("cache_warm: jobs must be an int, got %r" % (jobs,))
    if not 0 <= jobs < 2**31:
        raise invalid("cache_warm: jobs must be in [0, 2^31) (0 = the online CPUs), got %d"
                      % jobs)
    if progress is not None and not callable(progress):
        raise invalid("cache_warm: progress must be callable, got %r" % (progress,))
    sm_array = (_lib.c_int32 * len(sm_list))(*sm_list)
    o = _lib.new(_lib.fa_cache_warm_options)
    o.cache_dir = None if cache_dir is None else os.fsencode(cache_dir)
    o.sms = sm_array
    o.num_sms = len(sm_list)
    o.jobs = jobs
    o.presets = preset_bytes
    o.specs = spec_bytes
    o.ptx_compiler = _lib.PTX_COMPILER_OFF if ptx_only else _lib.PTX_COMPILER_AUTO
    failure = []

    def report(p, _user):
        if failure:
            return  # it raised before: the call runs on, unreported
        try:
            progress(_counts(p.contents))
        except BaseException as exc:  # never unwind through C
            failure.append(exc)

    callback = _lib.fa_cache_warm_progress_fn(report) if progress is not None else None
    if callback is not None:
        o.progress = callback
    result = _lib.new(_lib.fa_cache_warm_progress)
    status = _lib.lib().fa_cache_warm(ctypes.byref(o), ctypes.byref(result))
    counts = _counts(result)
    try:
        check(status)
    except Exception as err:
        if status == _lib.ERROR_COMPILE:  # the other kernels were written
            err.counts = counts
        raise
    finally:
        if failure:
            exc = failure[0]
            failure.clear()
            raise exc  # after the call (it chains any error of the call)
    return counts


def cache_warm_presets():
    """The built-in presets as a dict name -> description (fa_cache_warm_presets),
    in the library's order."""
    text = _lib.lib().fa_cache_warm_presets().decode("utf-8")
    out = {}
    for line in text.splitlines():
        name, _, description = line.partition(":")
        if name:
            out[name.strip()] = description.strip()
    return out


def cache_warm_preset(name):
    """The spec lines (str) of preset `name` (fa_cache_warm_preset).
    InvalidArgumentError naming the presets when there is no such preset."""
    if not isinstance(name, str):
        raise invalid("cache_warm_preset: name must be a str, got %r" % (name,))
    text = _lib.lib().fa_cache_warm_preset(name.encode("utf-8"))
    if text is None:
        check(_lib.ERROR_INVALID_ARGUMENT)  # with fa_last_error's message
    return text.decode("utf-8")
